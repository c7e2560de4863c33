"""The kit's ops over a pure-Python kernel equal the torch baseline for every layout.

The host kernel (``host_kernels.py``) moves bytes by the geometry alone and the baseline is
swapped for one that fails, so each case proves the shared geometry and the op skeleton
(checks, object and slot handling) bit-exact without any native code.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from host_kernels import HostKernels
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_reference import (
    REF_LAYOUTS,
    Geometry,
    build_cache,
    caches_equal,
    flat_tensors,
    object_shape,
    random_tensor,
    zeros_like_cache,
)

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.kernel_kit.checks import Unsupported
from lmcache.v1.platform.kernel_kit.kernels import KVKernels
from lmcache.v1.platform.kernel_kit.ops import KV_OP_NAMES, KVOps, kv_ops
from lmcache.v1.platform.ops_types import PageBufferShapeDesc, TransferDirection

DTYPES = [torch.float32, torch.bfloat16, torch.uint8]


class _NoFallback:
    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> None:
            raise AssertionError(f"{name} fell back to the torch baseline")

        return fail


def _strict_ops() -> KVOps:
    ops = KVOps(HostKernels())
    ops.baseline = _NoFallback()
    return ops


def _desc(fmt: int, g: Geometry, dtype: torch.dtype) -> PageBufferShapeDesc:
    layout = REF_LAYOUTS[fmt]
    return PageBufferShapeDesc(
        kv_size=layout.kv_size,
        nl=g.nl,
        nb=g.nb,
        bs=g.bs,
        nh=layout.nh_of(g),
        hs=layout.width_of(g),
        element_size=torch.empty(0, dtype=dtype).element_size(),
        dtype=dtype,
    )


@settings(max_examples=120, deadline=None)
@given(
    fmt=st.sampled_from(sorted(REF_LAYOUTS)),
    dtype=st.sampled_from(DTYPES),
    nl=st.integers(1, 2),
    nb=st.integers(2, 4),
    bs=st.sampled_from([1, 2]),
    bpo=st.integers(1, 2),
    skip=st.integers(0, 1),
    pointers=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_block_op_matches_the_baseline(
    fmt: int,
    dtype: torch.dtype,
    nl: int,
    nb: int,
    bs: int,
    bpo: int,
    skip: int,
    pointers: bool,
    seed: int,
) -> None:
    g = Geometry(nl=nl, nb=nb, bs=bs, nh=2, hs=4)
    layout = REF_LAYOUTS[fmt]
    gen = torch.Generator().manual_seed(seed)
    cache = build_cache(layout, g, random_tensor(dtype, gen))
    ids = torch.randperm(nb, generator=gen).tolist()
    ids[-1] = -1 if len(ids) > 1 else ids[-1]  # a padding id
    n_obj = -(-len(ids) // bpo)
    shape = object_shape(layout, g, bpo * bs)
    # MLA planes rebuilt from pointers share hs equally; the reference planes do not.
    as_pointers = pointers and fmt != 17
    paged: Any = (
        torch.tensor([t.data_ptr() for t in flat_tensors(cache)], dtype=torch.int64)
        if as_pointers
        else cache
    )
    desc = _desc(fmt, g, dtype)
    args = (torch.tensor(ids), "cpu", TransferDirection.D2H, desc, bpo * bs, fmt, skip)

    ours = [torch.zeros(shape, dtype=dtype) for _ in range(n_obj)]
    theirs = [torch.zeros(shape, dtype=dtype) for _ in range(n_obj)]
    _strict_ops().op("multi_layer_block_kv_transfer")(paged, ours, *args)
    torch_ops.multi_layer_block_kv_transfer(paged, theirs, *args)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))

    source = [random_tensor(dtype, gen)(shape) for _ in range(n_obj)]
    back, ref = zeros_like_cache(cache), zeros_like_cache(cache)
    back_paged: Any = (
        torch.tensor([t.data_ptr() for t in flat_tensors(back)], dtype=torch.int64)
        if as_pointers
        else back
    )
    h2d = (torch.tensor(ids), "cpu", TransferDirection.H2D, desc, bpo * bs, fmt, skip)
    _strict_ops().op("multi_layer_block_kv_transfer")(back_paged, source, *h2d)
    ref_paged: Any = (
        torch.tensor([t.data_ptr() for t in flat_tensors(ref)], dtype=torch.int64)
        if as_pointers
        else ref
    )
    torch_ops.multi_layer_block_kv_transfer(ref_paged, source, *h2d)
    assert caches_equal(back, ref)


@settings(max_examples=80, deadline=None)
@given(
    fmt=st.sampled_from(sorted(set(REF_LAYOUTS) - {4, 9})),  # kv_list: unilateral below
    dtype=st.sampled_from(DTYPES),
    nb=st.integers(2, 3),
    bs=st.sampled_from([1, 2]),
    tokens=st.integers(1, 5),
    skip=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_slot_op_matches_the_baseline(
    fmt: int, dtype: torch.dtype, nb: int, bs: int, tokens: int, skip: int, seed: int
) -> None:
    g = Geometry(nl=2, nb=nb, bs=bs, nh=2, hs=4)
    layout = REF_LAYOUTS[fmt]
    gen = torch.Generator().manual_seed(seed)
    cache = build_cache(layout, g, random_tensor(dtype, gen))
    tokens = min(tokens, nb * bs)
    slots = torch.randperm(nb * bs, generator=gen)[:tokens]
    slots[0] = -1 if tokens > 1 else slots[0]
    shape = object_shape(layout, g, tokens)
    skip = min(skip, tokens)
    args = (slots, "cpu", 0, TransferDirection.D2H, fmt, bs, g.hs, skip)

    ours, theirs = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    _strict_ops().op("multi_layer_kv_transfer")(ours, cache, *args)
    torch_ops.multi_layer_kv_transfer(theirs, cache, *args)
    assert torch.equal(ours, theirs)

    source = random_tensor(dtype, gen)(shape)
    back, ref = zeros_like_cache(cache), zeros_like_cache(cache)
    h2d = (slots, "cpu", 0, TransferDirection.H2D, fmt, bs, g.hs, skip)
    _strict_ops().op("multi_layer_kv_transfer")(source, back, *h2d)
    torch_ops.multi_layer_kv_transfer(source, ref, *h2d)
    assert caches_equal(back, ref)


def test_separate_kv_ops_match_the_baseline() -> None:
    gen = torch.Generator().manual_seed(7)
    k, v = torch.randn(3, 2, 2, 4, generator=gen), torch.randn(3, 2, 2, 4, generator=gen)
    slots = torch.tensor([5, -1, 0, 3])
    ops = _strict_ops()
    ours, theirs = torch.zeros(2, 2, 4, 8), torch.zeros(2, 2, 4, 8)
    ops.op("load_and_reshape_flash")(ours, k, v, slots, 1)
    torch_ops.load_and_reshape_flash(theirs, k, v, slots, 1)
    assert torch.equal(ours, theirs)
    lmc = torch.randn(2, 4, 8, generator=gen)
    k2, v2, k3, v3 = (torch.zeros_like(k) for _ in range(4))
    ops.op("single_layer_kv_transfer_sgl")(lmc, k2, v2, slots, TransferDirection.H2D)
    torch_ops.single_layer_kv_transfer_sgl(lmc, k3, v3, slots, TransferDirection.H2D)
    assert torch.equal(k2, k3) and torch.equal(v2, v3)


def test_ops_keep_the_baseline_signatures_and_only_what_the_kernels_implement() -> None:
    ops = kv_ops(HostKernels())
    assert set(ops) == set(KV_OP_NAMES) - {"lmcache_memcpy_async"}
    for name, op in ops.items():
        assert op.__name__ == name
        assert inspect.signature(op) == inspect.signature(getattr(torch_ops, name))
        assert op.__module__ == "lmcache.v1.platform.kernel_kit.ops"
    assert kv_ops(KVKernels()) == {}


def test_errors_are_the_baselines() -> None:
    op = _strict_ops().op("multi_layer_block_kv_transfer")
    g = Geometry(nl=1, nb=2, bs=2, nh=2, hs=4)
    cache = build_cache(REF_LAYOUTS[1], g, torch.zeros)
    desc = _desc(1, g, torch.float32)
    with pytest.raises(ValueError, match="positive multiple"):
        op(cache, [], [0], "cpu", TransferDirection.D2H, desc, 3, 1, 0)
    with pytest.raises(IndexError, match="out of range"):
        op(cache, [torch.zeros(2, 1, 2, 8)], [5], "cpu", TransferDirection.D2H, desc, 2, 1, 0)
    with pytest.raises(ValueError, match="unsupported engine_kv_format"):
        op(cache, [torch.zeros(2, 1, 2, 8)], [0], "cpu", TransferDirection.D2H, desc, 2, 99, 0)
    with pytest.raises(ValueError, match="expected a 5-d engine tensor"):
        op([torch.zeros(4, 4)], [torch.zeros(2, 1, 2, 8)], [0], "cpu", 1, desc, 2, 1, 0)


class _Declining(HostKernels):
    def copy_slots(self, job: Any) -> None:
        raise Unsupported("declined")


def test_declined_input_runs_the_baseline_with_the_original_arguments() -> None:
    calls: list[tuple[Any, ...]] = []

    class Recorder:
        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: calls.append((name, args, kwargs))

    ops = KVOps(_Declining())
    ops.baseline = Recorder()
    lmc, k, v, slots = (
        torch.zeros(2, 1, 2, 8),
        torch.zeros(2, 2, 2, 4),
        torch.zeros(2, 2, 2, 4),
        [0],
    )
    ops.op("load_and_reshape_flash")(lmc, k, v, slots, layer_idx=0)
    assert calls == [("load_and_reshape_flash", (lmc, k, v, slots), {"layer_idx": 0})]


def test_argument_binding_is_the_baselines() -> None:
    ops = KVOps(HostKernels())
    memcpy = KVOps(KVKernels()).op("lmcache_memcpy_async")
    with pytest.raises(TypeError):
        ops.op("multi_layer_kv_transfer")(torch.zeros(1), [])  # missing arguments
    with pytest.raises(TypeError):
        memcpy(1, 2, 3, 0, 0, 0, 7)  # one positional too many
    with pytest.raises(TypeError):
        memcpy(dest=1, src=2, nbytes=0, direction=0, host_buffer_offset=0,
               host_buffer_alignments=0)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    nl=st.integers(1, 3),
    nb=st.integers(1, 4),
    bs=st.sampled_from([1, 3]),
    widths=st.lists(st.integers(1, 5), min_size=2, max_size=3),
    bpo=st.integers(1, 2),
    pointers=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_mixed_dtype_mla_planes_run_natively_as_bytes(
    nl: int, nb: int, bs: int, widths: list[int], bpo: int, pointers: bool, seed: int
) -> None:
    dtypes = [torch.int8, torch.float16, torch.float32][: len(widths)]
    gen = torch.Generator().manual_seed(seed)

    def plane(w: int, dtype: torch.dtype) -> torch.Tensor:
        size = torch.empty(0, dtype=dtype).element_size()
        return torch.randint(0, 256, (nb, bs, 1, w * size), dtype=torch.uint8, generator=gen).view(
            dtype
        )

    layers = [tuple(plane(w, d) for w, d in zip(widths, dtypes)) for _ in range(nl)]
    row = sum(w * torch.empty(0, dtype=d).element_size() for w, d in zip(widths, dtypes))
    ids = torch.randperm(nb, generator=gen)
    n_obj = -(-nb // bpo)
    desc = PageBufferShapeDesc(kv_size=1, nl=nl, nb=nb, bs=bs, nh=1, hs=row, element_size=1,
                               dtype=torch.int8)  # fmt: skip
    ours = [torch.zeros(nl, bpo * bs, row, dtype=torch.int8) for _ in range(n_obj)]
    theirs = [o.clone() for o in ours]

    def objs(chunks: list[torch.Tensor]) -> list[Any]:
        return [c.data_ptr() for c in chunks] if pointers else chunks

    args = (ids, "cpu", TransferDirection.D2H, desc, bpo * bs, 17, 0)
    _strict_ops().op("multi_layer_block_kv_transfer")(layers, objs(ours), *args)
    torch_ops.multi_layer_block_kv_transfer(layers, objs(theirs), *args)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))

    back = [tuple(torch.zeros_like(p) for p in planes) for planes in layers]
    ref = [tuple(torch.zeros_like(p) for p in planes) for planes in layers]
    h2d = (ids, "cpu", TransferDirection.H2D, desc, bpo * bs, 17, 0)
    _strict_ops().op("multi_layer_block_kv_transfer")(back, objs(ours), *h2d)
    torch_ops.multi_layer_block_kv_transfer(ref, objs(theirs), *h2d)
    for got, want in zip(back, ref):
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want))
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
               for planes, orig in zip(back, layers) for a, b in zip(planes, orig))  # fmt: skip


@pytest.mark.parametrize("pointers", [False, True])
def test_cross_layer_format_given_per_layer_runs_natively(pointers: bool) -> None:
    g = Geometry(nl=3, nb=3, bs=2, nh=2, hs=3)
    cache = build_cache(REF_LAYOUTS[1], g, random_tensor(torch.float32, torch.Generator()))
    paged: Any = (
        torch.tensor([t.data_ptr() for t in cache], dtype=torch.int64) if pointers else cache
    )
    slots = torch.tensor([4, -1, 0, 5])
    args = (slots, "cpu", g.nb * g.bs, TransferDirection.D2H, 0, g.bs, g.hs, 1)
    ours, theirs = torch.zeros(2, 3, 4, 6), torch.zeros(2, 3, 4, 6)
    _strict_ops().op("multi_layer_kv_transfer")(ours, paged, *args)
    torch_ops.multi_layer_kv_transfer(theirs, paged, *args)
    assert torch.equal(ours, theirs) and bool(ours.any())
