"""Slot-mapped KV ops against the naive reference (loops over tokens)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kv_reference import (
    REF_LAYOUTS,
    Geometry,
    RefLayout,
    build_cache,
    caches_equal,
    flat_tensors,
    random_tensor,
    set_token_row,
    token_row,
    zeros_like_cache,
)

from lmcache.v1.platform.ops_types import EngineKVFormat, TransferDirection

D2H, H2D = TransferDirection.D2H, TransferDirection.H2D


def slot_walk(slots: list[int], skip: int, g: Geometry, kv_size: int) -> Any:
    for token, slot in enumerate(slots):
        if token < skip or slot < 0:
            continue
        block, offset = divmod(slot, g.bs)
        for layer in range(g.nl):
            for kv in range(kv_size):
                yield (kv, layer, token), (layer, kv, block, offset)


def reference_extract(layout: RefLayout, g: Geometry, cache: Any, kv: torch.Tensor,
                      slots: list[int], skip: int) -> None:  # fmt: skip
    for lmc_index, where in slot_walk(slots, skip, g, layout.kv_size):
        kv[lmc_index].copy_(token_row(layout, g, cache, *where))


def reference_scatter(layout: RefLayout, g: Geometry, cache: Any, kv: torch.Tensor,
                      slots: list[int], skip: int) -> None:  # fmt: skip
    for lmc_index, where in slot_walk(slots, skip, g, layout.kv_size):
        set_token_row(layout, g, cache, where, kv[lmc_index])


SLOTS = [9, 0, -1, 14, 3, 22, 7]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8], ids=str)
@pytest.mark.parametrize("fmt", sorted(REF_LAYOUTS), ids=lambda f: EngineKVFormat(f).name)
def test_multi_layer_kv_transfer_every_layout(ops: Any, fmt: int, dtype: torch.dtype) -> None:
    layout = REF_LAYOUTS[fmt]
    g = Geometry(nl=2, nb=6, bs=4, nh=2, hs=4)
    cache = build_cache(layout, g, random_tensor(dtype, torch.Generator().manual_seed(fmt)))
    width = layout.nh_of(g) * layout.width_of(g)
    key_value = torch.zeros(layout.kv_size, g.nl, len(SLOTS), width, dtype=dtype)
    expected = key_value.clone()
    slots = torch.tensor(SLOTS)
    ops.multi_layer_kv_transfer(
        key_value, cache, slots, torch.device("cpu"), g.nb * g.bs, D2H, EngineKVFormat(fmt),
        g.bs, 0, 1,
    )  # fmt: skip
    reference_extract(layout, g, cache, expected, SLOTS, 1)
    assert torch.equal(key_value, expected)

    target, expected_target = zeros_like_cache(cache), zeros_like_cache(cache)
    ops.multi_layer_kv_transfer(
        key_value, target, slots, torch.device("cpu"), g.nb * g.bs, H2D, EngineKVFormat(fmt),
        g.bs, 0, 1,
    )  # fmt: skip
    reference_scatter(layout, g, expected_target, key_value, SLOTS, 1)
    assert caches_equal(target, expected_target)


@pytest.mark.parametrize("fmt", [1, 2, 3, 6, 7, 18], ids=lambda f: EngineKVFormat(f).name)
def test_multi_layer_kv_transfer_pointer_mode(ops: Any, fmt: int) -> None:
    layout = REF_LAYOUTS[fmt]
    g = Geometry(nl=3, nb=6, bs=4, nh=2, hs=4)
    cache = build_cache(layout, g, random_tensor(torch.float16, torch.Generator().manual_seed(1)))
    ptrs = torch.tensor([t.data_ptr() for t in flat_tensors(cache)], dtype=torch.int64)
    width = layout.nh_of(g) * layout.width_of(g)
    key_value = torch.zeros(layout.kv_size, g.nl, len(SLOTS), width, dtype=torch.float16)
    expected = key_value.clone()
    ops.multi_layer_kv_transfer(
        key_value, ptrs, torch.tensor(SLOTS), torch.device("cpu"), g.nb * g.bs, D2H,
        EngineKVFormat(fmt), g.bs, layout.width_of(g),
    )  # fmt: skip
    reference_extract(layout, g, cache, expected, SLOTS, 0)
    assert torch.equal(key_value, expected)


def test_pointer_mode_rejects_non_tight_pools_and_hnd_without_geometry(ops: Any) -> None:
    cache = [torch.zeros(2, 4, 2, 2, 4)]
    ptrs = torch.tensor([cache[0].data_ptr()])
    kv = torch.zeros(2, 1, 2, 8)
    with pytest.raises(ValueError, match="non-tight"):
        ops.multi_layer_kv_transfer(kv, ptrs, torch.tensor([0, 1]), torch.device("cpu"), 8, D2H,
                                    EngineKVFormat.NL_X_TWO_NB_BS_NH_HS, 2, 4, 0, 999)  # fmt: skip
    with pytest.raises(ValueError, match="block_size and head_size"):
        ops.multi_layer_kv_transfer(kv, ptrs, torch.tensor([0, 1]), torch.device("cpu"), 8, D2H,
                                    EngineKVFormat.NL_X_TWO_NB_NH_BS_HS)  # fmt: skip


@pytest.mark.parametrize("token_major", [False, True])
@pytest.mark.parametrize("fmt", [1, 2, 3, 6, 16], ids=lambda f: EngineKVFormat(f).name)
def test_single_layer_kv_transfer(ops: Any, fmt: int, token_major: bool) -> None:
    layout = REF_LAYOUTS[fmt]
    g = Geometry(nl=1, nb=6, bs=4, nh=2, hs=4)
    cache = build_cache(layout, g, random_tensor(torch.float32, torch.Generator().manual_seed(2)))
    width = layout.nh_of(g) * layout.width_of(g)
    planes = torch.zeros(layout.kv_size, 1, len(SLOTS), width)
    reference_extract(layout, g, cache, planes, SLOTS, 0)
    if layout.kv_size == 1:
        lmc = torch.zeros(len(SLOTS), width)
        want = planes[0, 0]
    elif token_major:
        lmc = torch.zeros(len(SLOTS), 2, width)
        want = planes[:, 0].transpose(0, 1)
    else:
        lmc = torch.zeros(2, len(SLOTS), width)
        want = planes[:, 0]
    ops.single_layer_kv_transfer(lmc, cache[0], torch.tensor(SLOTS), D2H, EngineKVFormat(fmt),
                                 token_major)  # fmt: skip
    assert torch.equal(lmc, want)
    target = zeros_like_cache(cache)
    ops.single_layer_kv_transfer(lmc, target[0], torch.tensor(SLOTS), H2D, EngineKVFormat(fmt),
                                 token_major)  # fmt: skip
    expected_target = zeros_like_cache(cache)
    reference_scatter(layout, g, expected_target, planes, SLOTS, 0)
    assert caches_equal(target, expected_target)


def _separate_caches(g: Geometry) -> tuple[list[list[torch.Tensor]], RefLayout]:
    layout = REF_LAYOUTS[int(EngineKVFormat.TWO_X_NL_X_NB_BS_NH_HS)]
    return build_cache(layout, g, random_tensor(torch.float32, torch.Generator())), layout


@pytest.mark.parametrize("token_major", [False, True])
def test_single_layer_kv_transfer_sgl(ops: Any, token_major: bool) -> None:
    g = Geometry(nl=1, nb=6, bs=4, nh=2, hs=4)
    cache, layout = _separate_caches(g)
    planes = torch.zeros(2, 1, len(SLOTS), 8)
    reference_extract(layout, g, cache, planes, SLOTS, 0)
    lmc = torch.zeros(len(SLOTS), 2, 8) if token_major else torch.zeros(2, len(SLOTS), 8)
    ops.single_layer_kv_transfer_sgl(lmc, cache[0][0], cache[1][0], torch.tensor(SLOTS), D2H,
                                     token_major)  # fmt: skip
    assert torch.equal(lmc, planes[:, 0].transpose(0, 1) if token_major else planes[:, 0])
    k2, v2 = torch.zeros_like(cache[0][0]), torch.zeros_like(cache[1][0])
    ops.single_layer_kv_transfer_sgl(lmc, k2, v2, torch.tensor(SLOTS), H2D, token_major)
    assert caches_equal([[k2], [v2]], _scattered(layout, g, cache, planes))


def _scattered(layout: RefLayout, g: Geometry, like: Any, planes: torch.Tensor) -> Any:
    target = zeros_like_cache(like)
    reference_scatter(layout, g, target, planes, SLOTS, 0)
    return target


def test_flash_extract_and_cache_back(ops: Any) -> None:
    g = Geometry(nl=1, nb=6, bs=4, nh=2, hs=4)
    cache, layout = _separate_caches(g)
    key_value = torch.zeros(2, 3, len(SLOTS), 8)
    ops.load_and_reshape_flash(key_value, cache[0][0], cache[1][0], torch.tensor(SLOTS), 2)
    planes = torch.zeros(2, 1, len(SLOTS), 8)
    reference_extract(layout, g, cache, planes, SLOTS, 0)
    assert torch.equal(key_value[:, 2:3], planes)
    assert not key_value[:, :2].any()
    k2, v2 = torch.zeros_like(cache[0][0]), torch.zeros_like(cache[1][0])
    ops.reshape_and_cache_back_flash(key_value, k2, v2, torch.tensor(SLOTS), 2)
    assert caches_equal([[k2], [v2]], _scattered(layout, g, cache, planes))


@pytest.mark.parametrize("pointers", [False, True])
def test_unilateral_sglang_mha(ops: Any, pointers: bool) -> None:
    nl, pbs, hidden = 2, 24, 8
    buffers = [torch.randn(pbs, hidden) for _ in range(2 * nl)]  # K_0, K_1, V_0, V_1
    key_value = torch.zeros(2, nl, len(SLOTS), hidden)
    arg: Any = torch.tensor([b.data_ptr() for b in buffers]) if pointers else buffers
    ops.multi_layer_kv_transfer_unilateral(key_value, arg, torch.tensor(SLOTS),
                                           torch.device("cpu"), pbs, D2H,
                                           EngineKVFormat.TWO_X_NL_X_NBBS_NH_HS)  # fmt: skip
    for token, slot in enumerate(SLOTS):
        for layer in range(nl):
            for kv in range(2):
                want = buffers[kv * nl + layer][slot] if slot >= 0 else torch.zeros(hidden)
                assert torch.equal(key_value[kv, layer, token], want)


def test_slot_out_of_range(ops: Any) -> None:
    cache = [torch.zeros(2, 2, 4, 1, 2)]
    with pytest.raises(ValueError, match="out of range"):
        ops.multi_layer_kv_transfer(torch.zeros(2, 1, 1, 2), cache, torch.tensor([8]),
                                    torch.device("cpu"), 8, D2H,
                                    EngineKVFormat.NL_X_TWO_NB_BS_NH_HS)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    nl=st.integers(1, 3),
    nb=st.integers(1, 5),
    bs=st.sampled_from([1, 3, 5]),
    nh=st.integers(1, 3),
    hs=st.sampled_from([1, 3, 4]),
    pointers=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.uint8]),
    data=st.data(),
)
def test_cross_layer_format_given_one_buffer_per_layer(
    ops: Any, nl: int, nb: int, bs: int, nh: int, hs: int, pointers: bool,
    dtype: torch.dtype, data: st.DataObject,
) -> None:  # fmt: skip
    """Upstream reads NB_NL_TWO_BS_NH_HS given per layer as flash attention's layout."""
    # A single pointer stays one real cross-layer buffer (see token_format_spec).
    assume(not (pointers and nl == 1))
    g = Geometry(nl=nl, nb=nb, bs=bs, nh=nh, hs=hs)
    layout = REF_LAYOUTS[EngineKVFormat.NL_X_TWO_NB_BS_NH_HS]
    cache = build_cache(layout, g, random_tensor(dtype, torch.Generator().manual_seed(nb * bs)))
    slot_list = data.draw(st.lists(st.integers(-1, nb * bs - 1), max_size=2 * nb * bs))
    slots = torch.tensor(slot_list, dtype=torch.int64)
    skip = data.draw(st.integers(0, len(slot_list)))
    fmt = EngineKVFormat.NB_NL_TWO_BS_NH_HS

    def engine(c: Any) -> Any:
        return torch.tensor([t.data_ptr() for t in c], dtype=torch.int64) if pointers else c

    key_value = torch.zeros(2, nl, len(slot_list), nh * hs, dtype=dtype)
    expected = key_value.clone()
    ops.multi_layer_kv_transfer(
        key_value, engine(cache), slots, torch.device("cpu"), nb * bs, D2H, fmt, bs, 0, skip
    )
    reference_extract(layout, g, cache, expected, slot_list, skip)
    assert torch.equal(key_value, expected)

    source = random_tensor(dtype, torch.Generator().manual_seed(7))(tuple(key_value.shape))
    target, expected_target = zeros_like_cache(cache), zeros_like_cache(cache)
    ops.multi_layer_kv_transfer(
        source, engine(target), slots, torch.device("cpu"), nb * bs, H2D, fmt, bs, 0, skip
    )
    reference_scatter(layout, g, expected_target, source, slot_list, skip)
    assert caches_equal(target, expected_target)


def test_cross_layer_per_layer_buffers_in_upstreams_pointer_shape(ops: Any) -> None:
    """Upstream's scenario: per-layer [2, page_buffer_size, hidden] buffers, block size 1."""
    size, hidden = 7, 5
    layers = [torch.arange(2 * size * hidden, dtype=torch.float32).view(2, size, hidden) + 1000 * i
              for i in range(3)]  # fmt: skip
    ptrs = torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64)
    slots = torch.tensor([6, 0, -1, 3])
    key_value = torch.zeros(2, 3, 4, hidden)
    ops.multi_layer_kv_transfer(key_value, ptrs, slots, torch.device("cpu"), size, D2H,
                                EngineKVFormat.NB_NL_TWO_BS_NH_HS, 1)  # fmt: skip
    for layer in range(3):
        for token, slot in enumerate([6, 0, -1, 3]):
            want = layers[layer][:, slot] if slot >= 0 else torch.zeros(2, hidden)
            assert torch.equal(key_value[:, layer, token], want)


def test_cross_layer_single_buffer_keeps_the_cross_reading(ops: Any) -> None:
    g = Geometry(nl=2, nb=3, bs=2, nh=1, hs=3)
    layout = REF_LAYOUTS[EngineKVFormat.NB_NL_TWO_BS_NH_HS]
    cache = build_cache(layout, g, random_tensor(torch.float32, torch.Generator().manual_seed(3)))
    slots = [5, 0, 2]
    for engine in (cache, [cache], torch.tensor([cache.data_ptr()], dtype=torch.int64)):
        key_value = torch.zeros(2, g.nl, len(slots), g.hs)
        expected = key_value.clone()
        ops.multi_layer_kv_transfer(key_value, engine, torch.tensor(slots), torch.device("cpu"),
                                    g.nb * g.bs, D2H, EngineKVFormat.NB_NL_TWO_BS_NH_HS, g.bs,
                                    g.hs)  # fmt: skip
        reference_extract(layout, g, cache, expected, slots, 0)
        assert torch.equal(key_value, expected)
