"""multi_layer_block_kv_transfer: native == torch baseline, byte for byte."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kv_layouts import (
    DTYPES,
    Geometry,
    assert_same,
    build_cache,
    clone,
    pointers,
    random_factory,
    shape_desc,
)

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.ops_types import TransferDirection

ALL_FORMATS = list(range(19))


@st.composite
def block_cases(draw: st.DrawFn) -> dict[str, Any]:
    fmt = draw(st.sampled_from(ALL_FORMATS))
    g = Geometry(
        nl=draw(st.integers(1, 3)),
        nb=draw(st.integers(1, 12)),
        bs=draw(st.sampled_from([1, 2, 4, 16])),
        nh=draw(st.integers(1, 3)),
        hs=draw(st.sampled_from([1, 2, 4, 8, 16])),
    )
    bpo = draw(st.integers(1, 4))
    n_ids = draw(st.integers(0, 3 * bpo))
    # Any engine block may appear (repeats only on H2D would race, so keep ids unique).
    ids = draw(st.permutations(range(g.nb)))[:n_ids]
    ids = [b if not draw(st.booleans()) or b % 3 else -1 for b in ids]  # padding holes
    return {
        "fmt": fmt,
        "g": g,
        "dtype": draw(st.sampled_from(DTYPES)),
        "bpo": bpo,
        "ids": ids,
        "skip": draw(st.integers(0, max(0, len(ids)))),
        "direction": draw(st.sampled_from(list(TransferDirection))),
        "paged_mode": draw(st.sampled_from(["tensors", "pointers"])),
        "object_mode": draw(st.sampled_from(["tensors", "pointers"])),
        "partial_last_object": draw(st.booleans()),
        "ids_as_list": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def _objects(case: dict[str, Any], new: Any) -> list[torch.Tensor]:
    g, fmt, bpo = case["g"], case["fmt"], case["bpo"]
    n_objects = max(1, -(-len(case["ids"]) // bpo))
    tokens = [bpo * g.bs] * n_objects
    if case["partial_last_object"] and case["object_mode"] == "tensors":
        used = len(case["ids"]) - (n_objects - 1) * bpo
        tokens[-1] = max(1, used) * g.bs  # a short last chunk holds just its blocks
    return [new(g.object_shape(fmt, t)) for t in tokens]


def _run(op: Any, case: dict[str, Any], cache: Any, objects: list[torch.Tensor]) -> None:
    g, fmt, dtype = case["g"], case["fmt"], case["dtype"]
    paged = pointers(cache) if case["paged_mode"] == "pointers" else cache
    objs: list[Any] = objects
    if case["object_mode"] == "pointers":
        objs = [o.data_ptr() for o in objects]
    ids: Any = case["ids"] if case["ids_as_list"] else torch.tensor(case["ids"], dtype=torch.int64)
    op(
        paged,
        objs,
        ids,
        "cpu",
        case["direction"],
        shape_desc(fmt, g, dtype),
        case["bpo"] * g.bs,
        fmt,
        case["skip"],
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=block_cases())
def test_matches_baseline(native_ops: ModuleType, case: dict[str, Any]) -> None:
    new = random_factory(case["dtype"], case["seed"])
    cache = build_cache(case["fmt"], case["g"], new)
    objects = _objects(case, new)
    ref_cache, ref_objects = clone(cache), clone(objects)
    _run(torch_ops.multi_layer_block_kv_transfer, case, ref_cache, ref_objects)
    _run(native_ops.multi_layer_block_kv_transfer, case, cache, objects)
    assert_same(cache, ref_cache)
    assert_same(objects, ref_objects)


def test_layers_carved_from_one_allocation(native_ops: ModuleType) -> None:
    """vLLM allocates every layer from one buffer: strided per-layer views, one kernel."""
    g = Geometry(nl=4, nb=6, bs=16, nh=2, hs=8)
    whole = random_factory(torch.float16, 1)((g.nb, g.nl, 2, g.bs, g.nh, g.hs))
    layers = [whole[:, layer].transpose(0, 1) for layer in range(g.nl)]  # [2, NB, BS, NH, HS]
    objects = [torch.zeros(g.object_shape(1, 32), dtype=torch.float16) for _ in range(2)]
    ref_objects = clone(objects)
    args = ([5, 1, 3, 0], "cpu", TransferDirection.D2H, shape_desc(1, g, torch.float16), 32, 1, 0)
    native_ops.multi_layer_block_kv_transfer(layers, objects, *args)
    torch_ops.multi_layer_block_kv_transfer(layers, ref_objects, *args)
    assert_same(objects, ref_objects)


def test_non_tight_block_stride_in_pointer_mode(native_ops: ModuleType) -> None:
    g = Geometry(nl=2, nb=5, bs=4, nh=2, hs=4)
    block = g.bs * g.nh * g.hs
    pools = [random_factory(torch.float32, 3)((g.nb * (block + 8),)) for _ in range(g.nl)]
    desc = shape_desc(18, g, torch.float32)
    desc.block_stride_elems = block + 8
    ptrs = torch.tensor([p.data_ptr() for p in pools], dtype=torch.int64)
    objects = [torch.zeros(g.object_shape(18, 8)) for _ in range(2)]
    ref_objects = clone(objects)
    for op, objs in (
        (native_ops.multi_layer_block_kv_transfer, objects),
        (torch_ops.multi_layer_block_kv_transfer, ref_objects),
    ):
        op(ptrs, objs, [4, 0, 2], "cpu", TransferDirection.D2H, desc, 8, 18, 0)
    assert_same(objects, ref_objects)


class _NoFallback:
    """Stands in for torch_ops inside the wrappers: any fallback fails the test."""

    def __getattr__(self, name: str) -> Any:
        if name == "_format_spec":
            return torch_ops._format_spec

        def fail(*args: Any, **kwargs: Any) -> None:
            raise AssertionError(f"{name} fell back to the torch baseline")

        return fail


@pytest.fixture
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    from lmcache_cpu import native_ops

    kit_ops = native_ops.multi_layer_block_kv_transfer.kv_ops
    monkeypatch.setattr(kit_ops, "baseline", _NoFallback())


@pytest.mark.parametrize("paged_mode", ["tensors", "pointers"])
@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_every_format_runs_natively(
    native_ops: ModuleType, no_fallback: None, fmt: int, paged_mode: str
) -> None:
    g = Geometry(nl=2, nb=4, bs=2, nh=2, hs=4)
    new = random_factory(torch.bfloat16, fmt)
    case = {
        "fmt": fmt, "g": g, "dtype": torch.bfloat16, "bpo": 2, "ids": [3, 1, 2], "skip": 0,
        "direction": TransferDirection.D2H, "paged_mode": paged_mode, "object_mode": "pointers",
        "ids_as_list": False, "partial_last_object": False,
    }  # fmt: skip
    objects = _objects(case, new)
    _run(native_ops.multi_layer_block_kv_transfer, case, build_cache(fmt, g, new), objects)
    assert any(bool(o.ne(0).any()) for o in objects)
