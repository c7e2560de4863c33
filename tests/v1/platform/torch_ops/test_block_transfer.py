"""multi_layer_block_kv_transfer against the naive reference, for every layout."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_reference import (
    REF_LAYOUTS,
    Geometry,
    RefLayout,
    build_cache,
    caches_equal,
    flat_tensors,
    object_shape,
    random_tensor,
    reference_block_transfer,
    zeros_like_cache,
)

from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc, TransferDirection

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.uint8]
ALL_FORMATS = sorted(REF_LAYOUTS)


def shape_desc(layout: RefLayout, g: Geometry, dtype: torch.dtype) -> PageBufferShapeDesc:
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


def as_pointers(cache: Any) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in flat_tensors(cache)], dtype=torch.int64)


def round_trip(
    ops: Any,
    fmt: int,
    g: Geometry,
    dtype: torch.dtype,
    block_ids: list[int],
    blocks_per_object: int,
    skip: int,
    mode: str = "tensor",
    seed: int = 0,
) -> None:
    """Store a chunk (D2H), scatter it into a second cache (H2D); both match the reference."""
    layout = REF_LAYOUTS[fmt]
    new = random_tensor(dtype, torch.Generator().manual_seed(seed))
    cache = build_cache(layout, g, new)
    chunk = blocks_per_object * g.bs
    num_objects = max(1, -(-len(block_ids) // blocks_per_object))
    objects = [torch.zeros(object_shape(layout, g, chunk), dtype=dtype) for _ in range(num_objects)]
    expected_objects = [o.clone() for o in objects]
    desc = shape_desc(layout, g, dtype)

    def call(paged: Any, objs: list[torch.Tensor], direction: TransferDirection) -> None:
        paged_arg = as_pointers(paged) if mode == "all_ptr" else paged
        objs_arg: list[Any] = [o.data_ptr() for o in objs] if mode != "tensor" else objs
        ops.multi_layer_block_kv_transfer(
            paged_arg, objs_arg, torch.tensor(block_ids, dtype=torch.int64), "cpu",
            direction, desc, chunk, EngineKVFormat(fmt), skip,
        )  # fmt: skip

    call(cache, objects, TransferDirection.D2H)
    reference_block_transfer(
        layout, g, cache, expected_objects, block_ids, blocks_per_object, skip, store=True
    )
    for got, want in zip(objects, expected_objects):
        assert torch.equal(got, want)

    target = zeros_like_cache(cache)
    expected_target = zeros_like_cache(cache)
    call(target, objects, TransferDirection.H2D)
    reference_block_transfer(
        layout, g, expected_target, objects, block_ids, blocks_per_object, skip, store=False
    )
    assert caches_equal(target, expected_target)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bs", [1, 16, 32])
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: EngineKVFormat(f).name)
def test_layout_dtype_block_size(ops: Any, fmt: int, bs: int, dtype: torch.dtype) -> None:
    g = Geometry(nl=2, nb=6, bs=bs, nh=2, hs=4)
    # 3 objects of 2 blocks, the last one partial; a padding id and a skipped prefix block.
    round_trip(ops, fmt, g, dtype, [4, 1, -1, 5, 0], blocks_per_object=2, skip=1)


@pytest.mark.parametrize("mode", ["obj_ptr", "all_ptr"])
@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: EngineKVFormat(f).name)
def test_pointer_inputs(ops: Any, fmt: int, mode: str) -> None:
    if mode == "all_ptr" and fmt == EngineKVFormat.NL_X_NP_X_NB_BS_ONE_HS:
        pytest.skip("pointer mode splits shape_desc.hs equally; the reference planes differ")
    g = Geometry(nl=3, nb=5, bs=4, nh=2, hs=4)
    round_trip(ops, fmt, g, torch.float16, [2, 0, 4, -1, 3], blocks_per_object=3, skip=0, mode=mode)


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: EngineKVFormat(f).name)
def test_skip_whole_objects_and_all_padding(ops: Any, fmt: int) -> None:
    g = Geometry(nl=2, nb=8, bs=2, nh=1, hs=2)
    round_trip(ops, fmt, g, torch.float32, [1, 2, 3, 7, -1, -1, 6], blocks_per_object=2, skip=3)
    round_trip(ops, fmt, g, torch.float32, [-1, -1], blocks_per_object=2, skip=0)


@pytest.mark.parametrize("fmt", [1, 6, 11, 12, 18], ids=lambda f: EngineKVFormat(f).name)
def test_layers_carved_from_one_allocation(ops: Any, fmt: int) -> None:
    """Per-layer views of one buffer (what engines usually hand over) take the merged path."""
    layout = REF_LAYOUTS[fmt]
    g = Geometry(nl=4, nb=6, bs=4, nh=2, hs=4)
    single = build_cache(layout, g, random_tensor(torch.float32, torch.Generator().manual_seed(3)))
    whole = torch.stack(single)
    cache = list(whole.unbind(0))
    objects = [torch.zeros(object_shape(layout, g, 8)) for _ in range(2)]
    expected = [o.clone() for o in objects]
    desc = shape_desc(layout, g, torch.float32)
    ids = [5, 0, 3, 2]
    ops.multi_layer_block_kv_transfer(
        cache, objects, ids, "cpu", TransferDirection.D2H, desc, 8, EngineKVFormat(fmt), 0
    )
    reference_block_transfer(layout, g, cache, expected, ids, 2, 0, store=True)
    assert all(torch.equal(a, b) for a, b in zip(objects, expected))
    whole.zero_()
    ops.multi_layer_block_kv_transfer(
        cache, objects, ids, "cpu", TransferDirection.H2D, desc, 8, EngineKVFormat(fmt), 0
    )
    target = zeros_like_cache(single)
    reference_block_transfer(layout, g, target, objects, ids, 2, 0, store=False)
    assert caches_equal(cache, target)


def test_vllm_cpu_layout_is_fused_hnd(ops: Any) -> None:
    """vLLM's CPU cache NL x [NB, NH, BS, 2*HS] is NL_X_NB_NH_BS_CS with CS = 2*HS."""
    nl, nb, nh, bs, hs = 2, 4, 2, 16, 8
    cache = [torch.randn(nb, nh, bs, 2 * hs) for _ in range(nl)]
    obj = torch.zeros(nl, 32, nh * 2 * hs)
    desc = PageBufferShapeDesc(kv_size=1, nl=nl, nb=nb, bs=bs, nh=nh, hs=2 * hs, element_size=4)
    ops.multi_layer_block_kv_transfer(
        cache, [obj], [3, 1], "cpu", TransferDirection.D2H, desc, 32,
        EngineKVFormat.NL_X_NB_NH_BS_CS, 0,
    )  # fmt: skip
    # token 5 of the object is offset 5 of block 3; head 1's K half then V half.
    row = obj[1, 5].view(nh, 2 * hs)
    assert torch.equal(row[1, :hs], cache[1][3, 1, 5, :hs])
    assert torch.equal(row[1, hs:], cache[1][3, 1, 5, hs:])


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(ALL_FORMATS),
    nl=st.integers(1, 3),
    nb=st.integers(2, 8),
    bs=st.sampled_from([1, 2, 4]),
    nh=st.integers(1, 3),
    hs=st.sampled_from([2, 4, 8]),
    blocks_per_object=st.integers(1, 3),
    data=st.data(),
)
def test_random_shapes_and_block_permutations(
    ops: Any, fmt: int, nl: int, nb: int, bs: int, nh: int, hs: int,
    blocks_per_object: int, data: st.DataObject,
) -> None:  # fmt: skip
    g = Geometry(nl=nl, nb=nb, bs=bs, nh=nh, hs=hs)
    order = data.draw(st.permutations(range(nb)))
    count = data.draw(st.integers(1, nb))
    ids = [b if data.draw(st.booleans()) or i == 0 else -1 for i, b in enumerate(order[:count])]
    skip = data.draw(st.integers(0, count - 1))
    modes = ["tensor", "obj_ptr"] if fmt == 17 else ["tensor", "obj_ptr", "all_ptr"]
    mode = data.draw(st.sampled_from(modes))
    round_trip(ops, fmt, g, torch.float32, ids, blocks_per_object, skip, mode, seed=nb * 7 + nl)


def _call_with(ops: Any, **overrides: Any) -> None:
    args: dict[str, Any] = dict(
        paged_buffer_ptrs_tensor=[torch.zeros(2, 4, 4, 1, 2)],
        lmcache_objects_ptrs=[torch.zeros(2, 1, 8, 2)],
        block_ids=[0, 1],
        device="cpu",
        direction=TransferDirection.D2H,
        shape_desc=PageBufferShapeDesc(kv_size=2, nl=1, nb=4, bs=4, nh=1, hs=2, element_size=4),
        lmcache_chunk_size=8,
        engine_kv_format=EngineKVFormat.NL_X_TWO_NB_BS_NH_HS,
        skip_prefix_n_blocks=0,
    )
    args.update(overrides)
    ops.multi_layer_block_kv_transfer(*args.values())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lmcache_chunk_size": 0}, "lmcache_chunk_size must be positive"),
        ({"lmcache_chunk_size": 6}, "must be a positive multiple of shape_desc.bs"),
        ({"skip_prefix_n_blocks": -1}, "skip_prefix_n_blocks must be non-negative"),
        ({"direction": 7}, "direction must be"),
        ({"engine_kv_format": 19}, "engine_kv_format"),
        ({"block_ids": [0, 9]}, "out of range"),
        ({"block_ids": [0, 1, 2]}, "LMCache objects"),
    ],
)
def test_validation_messages(ops: Any, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _call_with(ops, **overrides)


def test_valid_call_passes(ops: Any) -> None:
    _call_with(ops)


# --------------------------------------------------------------------------------------
# MLA plane tuples of mixed dtypes: packed into the object row by bytes
# --------------------------------------------------------------------------------------

_PLANE_DTYPES = [torch.int8, torch.uint8, torch.float16, torch.bfloat16, torch.float32]


def _random_plane(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    # Arbitrary bit patterns (NaN payloads included): the copy must keep every byte.
    nbytes = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * nbytes), dtype=torch.uint8, generator=gen)
    return raw.view(dtype)


def _plane_bytes(plane: torch.Tensor, block: int, offset: int) -> torch.Tensor:
    return plane[block, offset, 0].reshape(1, -1).view(torch.uint8).reshape(-1)


def _mixed_reference(
    layers: list[tuple[torch.Tensor, ...]], objects: list[torch.Tensor], ids: list[int],
    bpo: int, bs: int, skip: int, store: bool,
) -> None:  # fmt: skip
    """Each object row is the planes' bytes side by side, in tuple order."""
    for position, block in enumerate(ids):
        if position < skip or block < 0:
            continue
        obj = objects[position // bpo].view(torch.uint8)
        for offset in range(bs):
            token = (position % bpo) * bs + offset
            for layer, planes in enumerate(layers):
                col = 0
                for plane in planes:
                    raw = _plane_bytes(plane, block, offset)
                    if store:
                        obj[layer, token, col : col + raw.numel()] = raw
                    else:
                        target = plane[block, offset, 0].view(torch.uint8)
                        target.copy_(obj[layer, token, col : col + raw.numel()])
                    col += raw.numel()


@settings(max_examples=40, deadline=None)
@given(
    nl=st.integers(1, 3),
    nb=st.integers(1, 6),
    bs=st.sampled_from([1, 3, 5]),
    planes=st.lists(
        st.tuples(st.sampled_from(_PLANE_DTYPES), st.integers(1, 5)), min_size=2, max_size=4
    ).filter(lambda p: len({d for d, _ in p}) > 1),
    bpo=st.integers(1, 3),
    pointers=st.booleans(),
    data=st.data(),
)
def test_mla_planes_of_mixed_dtypes_pack_by_bytes(
    ops: Any, nl: int, nb: int, bs: int, planes: list[tuple[torch.dtype, int]], bpo: int,
    pointers: bool, data: st.DataObject,
) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(nb * 31 + bs)
    layers = [tuple(_random_plane((nb, bs, 1, w), d, gen) for d, w in planes) for _ in range(nl)]
    row_bytes = sum(w * torch.empty(0, dtype=d).element_size() for d, w in planes)
    order = data.draw(st.permutations(range(nb)))
    count = data.draw(st.integers(0, nb))
    ids = [b if data.draw(st.booleans()) else -1 for b in order[:count]]
    skip = data.draw(st.integers(0, count))
    chunk = bpo * bs
    num_objects = max(1, -(-count // bpo))
    objects = [torch.zeros(nl, chunk, row_bytes, dtype=torch.int8) for _ in range(num_objects)]
    expected = [o.clone() for o in objects]
    desc = PageBufferShapeDesc(kv_size=1, nl=nl, nb=nb, bs=bs, nh=1, hs=row_bytes,
                               element_size=1, dtype=torch.int8)  # fmt: skip
    fmt = EngineKVFormat.NL_X_NP_X_NB_BS_ONE_HS

    def call(paged: Any, direction: TransferDirection) -> None:
        objs: list[Any] = [o.data_ptr() for o in objects] if pointers else objects
        ops.multi_layer_block_kv_transfer(
            paged, objs, torch.tensor(ids, dtype=torch.int64), "cpu", direction, desc, chunk,
            fmt, skip,
        )  # fmt: skip

    call(layers, TransferDirection.D2H)
    _mixed_reference(layers, expected, ids, bpo, bs, skip, store=True)
    for got, want in zip(objects, expected):
        assert torch.equal(got, want)

    target = [tuple(torch.zeros_like(p) for p in planes_) for planes_ in layers]
    expected_target = [tuple(torch.zeros_like(p) for p in planes_) for planes_ in layers]
    call(target, TransferDirection.H2D)
    _mixed_reference(expected_target, objects, ids, bpo, bs, skip, store=False)
    for got_planes, want_planes in zip(target, expected_target):
        for got_plane, want_plane in zip(got_planes, want_planes):
            assert torch.equal(got_plane.view(torch.uint8), want_plane.view(torch.uint8))


def test_mixed_dtype_planes_upstream_case(ops: Any) -> None:
    """int8 latent + float16 scale: a 10-byte row, scale bytes after the latent's."""
    latent = torch.arange(2 * 3 * 8, dtype=torch.int8).view(2, 3, 1, 8)
    scale = torch.tensor([1.5, -2.0, 0.25, 4.0, 0.5, -8.0], dtype=torch.float16).view(2, 3, 1, 1)
    obj = torch.zeros(1, 6, 10, dtype=torch.int8)
    desc = PageBufferShapeDesc(kv_size=1, nl=1, nb=2, bs=3, nh=1, hs=10, element_size=1,
                               dtype=torch.int8)  # fmt: skip
    ops.multi_layer_block_kv_transfer(
        [(latent, scale)], [obj], torch.tensor([1, 0]), "cpu", TransferDirection.D2H, desc, 6,
        EngineKVFormat.NL_X_NP_X_NB_BS_ONE_HS, 0,
    )  # fmt: skip
    assert torch.equal(obj[0, :3, :8], latent[1, :, 0])
    assert torch.equal(obj[0, 3:, :8], latent[0, :, 0])
    scale_bytes = obj[0, :3, 8:].contiguous().view(torch.float16)
    assert torch.equal(scale_bytes.reshape(-1), scale[1].reshape(-1))


def test_mixed_dtype_planes_need_a_contiguous_last_axis(ops: Any) -> None:
    latent = torch.zeros(2, 3, 1, 8, dtype=torch.int8)
    scale = torch.zeros(2, 3, 1, 4, dtype=torch.float16)[..., ::2]
    desc = PageBufferShapeDesc(kv_size=1, nl=1, nb=2, bs=3, nh=1, hs=12, element_size=1,
                               dtype=torch.int8)  # fmt: skip
    with pytest.raises(ValueError, match="contiguous in their last axis"):
        ops.multi_layer_block_kv_transfer(
            [(latent, scale)], [torch.zeros(1, 3, 12, dtype=torch.int8)], [0], "cpu",
            TransferDirection.D2H, desc, 3, EngineKVFormat.NL_X_NP_X_NB_BS_ONE_HS, 0,
        )  # fmt: skip
