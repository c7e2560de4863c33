"""Slot-mapped ops (token granular): native == torch baseline, byte for byte."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kv_layouts import DTYPES, Geometry, assert_same, build_cache, clone, pointers, random_factory

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.ops_types import TransferDirection

# Formats whose per-layer geometry the baseline can rebuild from a single pointer per
# buffer in slot-mapped pointer mode (NHD rows; HND needs block_size and head_size).
POINTER_FORMATS = [1, 2, 3, 9, 18]


def _slots(draw: st.DrawFn, capacity: int, tokens: int) -> list[int]:
    chosen = draw(st.permutations(range(capacity)))[:tokens]
    return [s if draw(st.integers(0, 4)) else -1 for s in chosen]  # sprinkle padding


@st.composite
def multi_layer_cases(draw: st.DrawFn) -> dict[str, Any]:
    fmt = draw(st.sampled_from(range(19)))
    g = Geometry(
        nl=draw(st.integers(1, 3)),
        nb=draw(st.integers(1, 6)),
        bs=draw(st.sampled_from([1, 2, 4, 16])),
        nh=draw(st.integers(1, 3)),
        hs=draw(st.sampled_from([1, 2, 8])),
    )
    tokens = draw(st.integers(0, min(40, g.nb * g.bs)))
    pointer_mode = fmt in POINTER_FORMATS and draw(st.booleans())
    return {
        "fmt": fmt,
        "g": g,
        "dtype": draw(st.sampled_from(DTYPES)),
        "slots": _slots(draw, g.nb * g.bs, tokens),
        "skip": draw(st.integers(0, tokens)),
        "direction": draw(st.sampled_from(list(TransferDirection))),
        "pointer_mode": pointer_mode,
        "seed": draw(st.integers(0, 2**16)),
    }


def _multi_layer(op: Any, case: dict[str, Any], cache: Any, key_value: torch.Tensor) -> None:
    g, fmt = case["g"], case["fmt"]
    paged = pointers(cache) if case["pointer_mode"] else cache
    op(
        key_value,
        paged,
        torch.tensor(case["slots"], dtype=torch.int64),
        torch.device("cpu"),
        g.nb * g.bs,
        case["direction"],
        fmt,
        g.bs,
        g.hs,
        case["skip"],
    )


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=multi_layer_cases())
def test_multi_layer_kv_transfer_matches_baseline(
    native_ops: ModuleType, case: dict[str, Any]
) -> None:
    g, fmt = case["g"], case["fmt"]
    new = random_factory(case["dtype"], case["seed"])
    cache = build_cache(fmt, g, new)
    key_value = new(g.object_shape(fmt, len(case["slots"])))
    if key_value.dim() == 3:
        key_value = key_value.unsqueeze(0)  # MLA [1, NL, T, D]
    ref_cache, ref_kv = clone(cache), key_value.clone()
    _multi_layer(torch_ops.multi_layer_kv_transfer, case, ref_cache, ref_kv)
    _multi_layer(native_ops.multi_layer_kv_transfer, case, cache, key_value)
    assert_same(cache, ref_cache)
    assert_same(key_value, ref_kv)


@st.composite
def flash_cases(draw: st.DrawFn) -> dict[str, Any]:
    g = Geometry(
        nl=draw(st.integers(1, 3)),
        nb=draw(st.integers(1, 5)),
        bs=draw(st.sampled_from([1, 4, 16])),
        nh=draw(st.integers(1, 3)),
        hs=draw(st.sampled_from([1, 4, 8])),
    )
    tokens = draw(st.integers(0, min(30, g.nb * g.bs)))
    return {
        "g": g,
        "dtype": draw(st.sampled_from(DTYPES)),
        "slots": _slots(draw, g.nb * g.bs, tokens),
        "layer": draw(st.integers(0, g.nl - 1)),
        "op": draw(
            st.sampled_from(
                [
                    "load_and_reshape_flash",
                    "reshape_and_cache_back_flash",
                    "single_layer_kv_transfer_sgl",
                    "single_layer_kv_transfer",
                    "multi_layer_kv_transfer_unilateral",
                ]
            )
        ),
        "direction": draw(st.sampled_from(list(TransferDirection))),
        "token_major": draw(st.booleans()),
        "single_fmt": draw(st.sampled_from([1, 2, 3, 6, 7, 12, 13, 16, 17, 18])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _flash_inputs(case: dict[str, Any]) -> tuple[Any, ...]:
    """Fresh inputs for one op call (built twice from the same seed)."""
    g, name = case["g"], case["op"]
    new = random_factory(case["dtype"], case["seed"])
    tokens = len(case["slots"])
    slots = torch.tensor(case["slots"], dtype=torch.int64)
    row = g.nh * g.hs
    if name in ("load_and_reshape_flash", "reshape_and_cache_back_flash"):
        key_value = new((2, g.nl, tokens, row))
        k, v = new((g.nb, g.bs, g.nh, g.hs)), new((g.nb, g.bs, g.nh, g.hs))
        return (key_value, k, v, slots, case["layer"])
    if name == "single_layer_kv_transfer_sgl":
        lmc = new((tokens, 2, row)) if case["token_major"] else new((2, tokens, row))
        k, v = new((g.nb, g.bs, g.nh, g.hs)), new((g.nb, g.bs, g.nh, g.hs))
        return (lmc, k, v, slots, case["direction"], case["token_major"])
    if name == "multi_layer_kv_transfer_unilateral":
        key_value = new((2, g.nl, tokens, row))
        buffers = [new((g.nb * g.bs, g.nh, g.hs)) for _ in range(2 * g.nl)]
        return (key_value, buffers, slots, torch.device("cpu"), g.nb * g.bs, case["direction"], 4)
    fmt = case["single_fmt"]
    layer_cache = build_cache(fmt, Geometry(1, g.nb, g.bs, g.nh, g.hs), new)[0]
    width = g.width(fmt) * g.heads(fmt)
    if g.kv_size(fmt) == 1:
        lmc = new((tokens, width))
    else:
        lmc = new((tokens, 2, width)) if case["token_major"] else new((2, tokens, width))
    return (lmc, layer_cache, slots, case["direction"], fmt, case["token_major"])


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=flash_cases())
def test_single_layer_ops_match_baseline(native_ops: ModuleType, case: dict[str, Any]) -> None:
    ref_args, args = _flash_inputs(case), _flash_inputs(case)
    getattr(torch_ops, case["op"])(*ref_args)
    getattr(native_ops, case["op"])(*args)
    assert_same(list(_tensors(args)), list(_tensors(ref_args)))


def _tensors(args: tuple[Any, ...]) -> Any:
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors(tuple(a))


@pytest.mark.parametrize("fmt", [1, 2, 6, 7, 12, 13, 18])
def test_hnd_and_fused_pointer_mode(native_ops: ModuleType, fmt: int) -> None:
    g = Geometry(nl=2, nb=3, bs=4, nh=2, hs=4)
    new = random_factory(torch.float16, fmt)
    cache = build_cache(fmt, g, new)
    key_value = torch.zeros(g.object_shape(fmt, 6), dtype=torch.float16)
    if key_value.dim() == 3:
        key_value = key_value.unsqueeze(0)
    ref = key_value.clone()
    slots = torch.tensor([11, 0, -1, 5, 6, 7])
    hs = g.width(fmt)
    for op, kv in ((native_ops.multi_layer_kv_transfer, key_value),
                   (torch_ops.multi_layer_kv_transfer, ref)):  # fmt: skip
        op(kv, pointers(cache), slots, "cpu", 12, TransferDirection.D2H, fmt, g.bs, hs, 1)
    assert_same(key_value, ref)
