"""Engine KV buffers of every ``EngineKVFormat`` for the conformance suite's
bit-exactness tests.

The torch baseline is the reference; these helpers only build inputs for both sides.
``new`` factories create tensors on the device the suite runs against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lmcache.v1.platform.ops_types import PageBufferShapeDesc

New = Callable[[tuple[int, ...]], torch.Tensor]

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.uint8, torch.int8)
MLA_FORMATS = frozenset({3, 5, 14, 17})
FUSED_FORMATS = frozenset({10, 11, 12, 13})
SINGLE_PLANE_FORMATS = MLA_FORMATS | FUSED_FORMATS | {18}


@dataclass(frozen=True)
class Geometry:
    nl: int
    nb: int
    bs: int
    nh: int
    hs: int

    def heads(self, fmt: int) -> int:
        return 1 if fmt in MLA_FORMATS else self.nh

    def width(self, fmt: int) -> int:
        """Per-head width of one LMCache row (fused K|V doubles it, MLA planes add up)."""
        if fmt in FUSED_FORMATS:
            return 2 * self.hs
        if fmt == 17:
            return 2 * self.hs
        return self.hs

    def kv_size(self, fmt: int) -> int:
        return 1 if fmt in SINGLE_PLANE_FORMATS else 2

    def object_shape(self, fmt: int, tokens: int) -> tuple[int, ...]:
        row = self.heads(fmt) * self.width(fmt)
        return (self.nl, tokens, row) if self.kv_size(fmt) == 1 else (2, self.nl, tokens, row)


def _layers(g: Geometry, new: New, shape: tuple[int, ...]) -> list[torch.Tensor]:
    return [new(shape) for _ in range(g.nl)]


def build_cache(fmt: int, g: Geometry, new: New) -> Any:
    nl, nb, bs, nh, hs = g.nl, g.nb, g.bs, g.nh, g.hs
    builders: dict[int, Callable[[], Any]] = {
        0: lambda: new((nb, nl, 2, bs, nh, hs)),
        1: lambda: _layers(g, new, (2, nb, bs, nh, hs)),
        2: lambda: _layers(g, new, (nb, 2, bs, nh, hs)),
        3: lambda: _layers(g, new, (nb, bs, hs)),
        4: lambda: [[new((nb * bs, nh, hs)) for _ in range(nl)] for _ in range(2)],
        5: lambda: _layers(g, new, (nb * bs, 1, hs)),
        6: lambda: _layers(g, new, (2, nb, nh, bs, hs)),
        7: lambda: _layers(g, new, (nb, 2, nh, bs, hs)),
        8: lambda: new((nb, nl, 2, nh, bs, hs)),
        9: lambda: [[new((nb, bs, nh, hs)) for _ in range(nl)] for _ in range(2)],
        10: lambda: _layers(g, new, (nb, nh, bs, 2, hs)),
        11: lambda: _layers(g, new, (nb, bs, nh, 2, hs)),
        12: lambda: _layers(g, new, (nb, nh, bs, 2 * hs)),
        13: lambda: _layers(g, new, (nb, bs, nh, 2 * hs)),
        14: lambda: _layers(g, new, (nb, bs, hs)),
        15: lambda: _layers(g, new, (2, nb, nh, 1, bs, hs)),
        16: lambda: [(new((nb, bs, nh, hs)), new((nb, bs, nh, hs))) for _ in range(nl)],
        17: lambda: [(new((nb, bs, 1, hs)), new((nb, bs, 1, hs))) for _ in range(nl)],
        18: lambda: _layers(g, new, (nb, bs, nh, hs)),
    }
    return builders[fmt]()


def shape_desc(fmt: int, g: Geometry, dtype: torch.dtype) -> PageBufferShapeDesc:
    return PageBufferShapeDesc(
        kv_size=g.kv_size(fmt),
        nl=g.nl,
        nb=g.nb,
        bs=g.bs,
        nh=g.heads(fmt),
        hs=g.width(fmt),
        element_size=torch.empty(0, dtype=dtype).element_size(),
        dtype=dtype,
    )


def random_factory(dtype: torch.dtype, seed: int, device: str = "cpu") -> New:
    """Random tensors, drawn on the host (reproducible) and moved to ``device``."""
    gen = torch.Generator().manual_seed(seed)

    def new(shape: tuple[int, ...]) -> torch.Tensor:
        if dtype == torch.uint8:
            host = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
        elif dtype == torch.int8:
            host = torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)
        else:
            host = torch.randn(shape, generator=gen).to(dtype)
        return host.to(device)

    return new


def flat_tensors(cache: Any) -> list[torch.Tensor]:
    """Every tensor of a container in pointer order (layer-major; K list before V list)."""
    if isinstance(cache, torch.Tensor):
        return [cache]
    return [t for item in cache for t in flat_tensors(item)]


def clone(cache: Any) -> Any:
    if isinstance(cache, torch.Tensor):
        return cache.clone()
    return type(cache)(clone(x) for x in cache)


def pointers(cache: Any) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in flat_tensors(cache)], dtype=torch.int64)


def assert_same(a: Any, b: Any) -> None:
    for x, y in zip(flat_tensors(a), flat_tensors(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x.cpu().view(torch.uint8), y.cpu().view(torch.uint8)), "bytes differ"
