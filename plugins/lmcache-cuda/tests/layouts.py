"""Engine KV caches for every ``EngineKVFormat``, built from the baseline's spec records.

Shared by the CPU plan tests and the GPU kernel tests: a cache is built with the container
and axis names the format declares, so a layout the baseline accepts is exercised as-is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lmcache.v1.platform.kv_formats import all_specs as _all_specs
from lmcache.v1.platform.kv_formats import format_spec as _format_spec
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc

ALL_FORMATS = [int(s.engine_kv_format) for s in _all_specs()]


@dataclass(frozen=True)
class Shape:
    nl: int
    nb: int
    bs: int
    nh: int
    hs: int


def _tensor_shape(spec: Any, g: Shape, hs: int) -> tuple[int, ...]:
    sizes = {"KV": 2, "NL": g.nl, "NB": g.nb, "BS": g.bs, "PBS": g.nb * g.bs, "NH": g.nh}
    sizes.update(HS=hs, ONE=1)
    shape = [sizes[d] for d in spec.dims]
    if spec.packed_tail > 1:  # fused K|V stored as [.., 2, HS]
        shape[-1:] = [spec.packed_tail, hs]
    return tuple(shape)


def build_cache(fmt: int, g: Shape, dtype: torch.dtype, device: Any, gen: torch.Generator) -> Any:
    spec = _format_spec(fmt)

    def new(shape: tuple[int, ...]) -> torch.Tensor:
        if dtype == torch.uint8:
            t = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
        else:
            t = torch.randn(shape, generator=gen).to(dtype)
        return t.to(device)

    if spec.container == "cross":
        return new(_tensor_shape(spec, g, g.hs))
    if spec.container == "layers":
        return [new(_tensor_shape(spec, g, g.hs)) for _ in range(g.nl)]
    if spec.container == "kv_layers":
        return [[new(_tensor_shape(spec, g, g.hs)) for _ in range(g.nl)] for _ in range(2)]
    if spec.tuple_axis == "KV":
        return [tuple(new(_tensor_shape(spec, g, g.hs)) for _ in range(2)) for _ in range(g.nl)]
    widths = (g.hs, max(1, g.hs // 2))  # MLA planes of different widths
    return [tuple(new(_tensor_shape(spec, g, w)) for w in widths) for _ in range(g.nl)]


def flat(cache: Any) -> list[torch.Tensor]:
    if isinstance(cache, torch.Tensor):
        return [cache]
    return [t for item in cache for t in flat(item)]


def clone(cache: Any, zero: bool = False) -> Any:
    if isinstance(cache, torch.Tensor):
        return torch.zeros_like(cache) if zero else cache.clone()
    return type(cache)(clone(x, zero) for x in cache)


def equal(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(flat(a), flat(b)))


def object_tokens_shape(fmt: int, g: Shape, tokens: int) -> tuple[int, ...]:
    spec = _format_spec(fmt)
    if spec.tuple_axis == "HS":
        width = g.hs + max(1, g.hs // 2)
    elif spec.fused_packed:
        width = 2 * g.hs if spec.packed_tail > 1 else g.hs
    else:
        width = g.hs
    heads = 1 if spec.mla else g.nh
    if spec.kv_size == 1:
        return (g.nl, tokens, heads * width)
    return (2, g.nl, tokens, heads * width)


def shape_desc(g: Shape, dtype: torch.dtype) -> PageBufferShapeDesc:
    return PageBufferShapeDesc(
        kv_size=2,
        nl=g.nl,
        nb=g.nb,
        bs=g.bs,
        nh=g.nh,
        hs=g.hs,
        element_size=torch.empty(0, dtype=dtype).element_size(),
        dtype=dtype,
    )


__all__ = ["ALL_FORMATS", "EngineKVFormat", "Shape", "build_cache", "clone", "equal"]
