"""The copy-plan geometry of every layout, checked on the CPU against the torch baseline.

The kit's ops run over the plugin's plan kernels with host memory, and the plans are
executed by a host emulator of the CUDA kernel (``emulator.py``); the result must equal the
baseline's bit for bit, and no input may fall back. This covers everything the native path
computes except the kernel's own launch, without a GPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from emulator import EmulatedKernels
from hypothesis import given, settings
from hypothesis import strategies as st
from layouts import ALL_FORMATS, Shape, build_cache, clone, equal, object_tokens_shape, shape_desc

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.kernel_kit.ops import KVOps
from lmcache.v1.platform.kv_formats import format_spec as _format_spec
from lmcache.v1.platform.ops_types import TransferDirection
from lmcache_cuda._plan import CopyPlan

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.uint8]


class _NoFallback:
    """Stands in for torch_ops inside the kit: any fallback fails the test."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> None:
            raise AssertionError(f"{name} fell back to the torch baseline")

        return fail


class _Recording(EmulatedKernels):
    """Keeps the plans it executed, to check the launch tuning."""

    def __init__(self) -> None:
        self.plans: list[CopyPlan] = []

    def execute(self, plans: Any, device: torch.device) -> None:
        self.plans.extend(plans)
        super().execute(plans, device)


def _ops(kernels: EmulatedKernels | None = None) -> KVOps:
    ops = KVOps(kernels or EmulatedKernels())
    ops.baseline = _NoFallback()
    return ops


def _block_ids(draw: Any, nb: int, count: int) -> list[int]:
    perm = draw(st.permutations(list(range(nb))))
    ids = list(perm[:count])
    holes = draw(st.lists(st.integers(0, count - 1), max_size=2))
    for hole in holes:
        ids[hole] = -1
    return ids


@st.composite
def block_cases(draw: Any) -> dict[str, Any]:
    fmt = draw(st.sampled_from(ALL_FORMATS))
    g = Shape(
        nl=draw(st.integers(1, 3)),
        nb=draw(st.integers(2, 6)),
        bs=draw(st.sampled_from([1, 2, 4])),
        nh=draw(st.integers(1, 3)),
        hs=draw(st.sampled_from([2, 4, 8])),
    )
    bpo = draw(st.integers(1, 2))
    count = draw(st.integers(1, g.nb))
    return {
        "fmt": fmt,
        "g": g,
        "dtype": draw(st.sampled_from(DTYPES)),
        "bpo": bpo,
        "ids": _block_ids(draw, g.nb, count),
        "skip": draw(st.integers(0, 1)),
        "pointers": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def _objects(case: dict[str, Any], zero: bool) -> list[torch.Tensor]:
    g: Shape = case["g"]
    chunk = case["bpo"] * g.bs
    n_obj = -(-len(case["ids"]) // case["bpo"])
    shape = object_tokens_shape(case["fmt"], g, chunk)
    gen = torch.Generator().manual_seed(case["seed"] + 1)
    make = (
        (lambda: torch.zeros(shape, dtype=case["dtype"]))
        if zero
        else (lambda: torch.randint(0, 100, shape, generator=gen).to(case["dtype"]))
    )
    return [make() for _ in range(n_obj)]


def _args(case: dict[str, Any], cache: Any, objects: list[torch.Tensor], direction: Any) -> tuple:
    g: Shape = case["g"]
    paged: Any = cache
    if case["pointers"] and _format_spec(case["fmt"]).container != "layer_tuples":
        paged = torch.tensor([t.data_ptr() for t in _flat(cache)], dtype=torch.int64)
    objs: list[Any] = [o.data_ptr() for o in objects] if case["pointers"] else objects
    return (
        paged,
        objs,
        torch.tensor(case["ids"]),
        "cpu",
        direction,
        shape_desc(g, case["dtype"]),
        case["bpo"] * g.bs,
        case["fmt"],
        case["skip"],
    )


def _flat(cache: Any) -> list[torch.Tensor]:
    if isinstance(cache, torch.Tensor):
        return [cache]
    return [t for item in cache for t in _flat(item)]


@settings(max_examples=150, deadline=None)
@given(block_cases())
def test_block_plans_match_the_baseline(case: dict[str, Any]) -> None:
    g: Shape = case["g"]
    gen = torch.Generator().manual_seed(case["seed"])
    cache = build_cache(case["fmt"], g, case["dtype"], "cpu", gen)

    # D2H: engine -> objects
    ours, theirs = _objects(case, zero=True), _objects(case, zero=True)
    _ops().op("multi_layer_block_kv_transfer")(*_args(case, cache, ours, TransferDirection.D2H))
    torch_ops.multi_layer_block_kv_transfer(*_args(case, cache, theirs, TransferDirection.D2H))
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)

    # H2D: objects -> engine
    source = _objects(case, zero=False)
    ours_cache, theirs_cache = clone(cache, zero=True), clone(cache, zero=True)
    _ops().op("multi_layer_block_kv_transfer")(
        *_args(case, ours_cache, source, TransferDirection.H2D)
    )
    torch_ops.multi_layer_block_kv_transfer(
        *_args(case, theirs_cache, source, TransferDirection.H2D)
    )
    assert equal(ours_cache, theirs_cache)


@settings(max_examples=100, deadline=None)
@given(
    fmt=st.sampled_from(ALL_FORMATS),
    dtype=st.sampled_from(DTYPES),
    nl=st.integers(1, 3),
    nb=st.integers(2, 5),
    bs=st.sampled_from([1, 2, 4]),
    nh=st.integers(1, 3),
    hs=st.sampled_from([2, 4]),
    tokens=st.integers(1, 6),
    skip=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_token_plans_match_the_baseline(
    fmt: int,
    dtype: torch.dtype,
    nl: int,
    nb: int,
    bs: int,
    nh: int,
    hs: int,
    tokens: int,
    skip: int,
    seed: int,
) -> None:
    g = Shape(nl, nb, bs, nh, hs)
    gen = torch.Generator().manual_seed(seed)
    cache = build_cache(fmt, g, dtype, "cpu", gen)
    tokens = min(tokens, nb * bs)
    slots = torch.randperm(nb * bs, generator=gen)[:tokens]
    slots[0] = -1 if tokens > 1 else slots[0]
    shape = object_tokens_shape(fmt, g, tokens)

    ours, theirs = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    _ops().op("multi_layer_kv_transfer")(
        ours, cache, slots, "cpu", 0, TransferDirection.D2H, fmt, bs, 0, min(skip, tokens)
    )
    torch_ops.multi_layer_kv_transfer(
        theirs, cache, slots, "cpu", 0, TransferDirection.D2H, fmt, bs, 0, min(skip, tokens)
    )
    assert torch.equal(ours, theirs)

    source = torch.randint(0, 100, shape, generator=gen).to(dtype)
    ours_cache, theirs_cache = clone(cache, zero=True), clone(cache, zero=True)
    _ops().op("multi_layer_kv_transfer")(
        source, ours_cache, slots, "cpu", 0, TransferDirection.H2D, fmt, bs
    )
    torch_ops.multi_layer_kv_transfer(
        source, theirs_cache, slots, "cpu", 0, TransferDirection.H2D, fmt, bs
    )
    assert equal(ours_cache, theirs_cache)


def test_vector_width_follows_alignment() -> None:
    g = Shape(nl=2, nb=4, bs=4, nh=2, hs=8)
    cache = build_cache(1, g, torch.float16, "cpu", torch.Generator().manual_seed(0))
    objects = [torch.zeros(object_tokens_shape(1, g, 8), dtype=torch.float16)]
    kernels = _Recording()
    _ops(kernels).op("multi_layer_block_kv_transfer")(
        cache, objects, [0, 1], "cpu", TransferDirection.D2H, shape_desc(g, torch.float16), 8, 1, 0
    )
    plans = kernels.plans
    assert len(plans) == 1
    # 8 fp16 per head = 16 bytes; torch allocations are 64-byte aligned.
    assert plans[0].vector_bytes() == 16
    assert plans[0].rows == g.bs and plans[0].num_heads == g.nh


def test_validation_errors_are_the_baselines() -> None:
    g = Shape(nl=1, nb=2, bs=2, nh=1, hs=2)
    cache = build_cache(1, g, torch.float32, "cpu", torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="positive multiple"):
        _ops().op("multi_layer_block_kv_transfer")(
            cache,
            [],
            [0],
            "cpu",
            TransferDirection.D2H,
            shape_desc(g, torch.float32),
            3,
            1,
            0,
        )
    with pytest.raises(ValueError, match="out of range"):
        _ops().op("multi_layer_block_kv_transfer")(
            cache,
            [torch.zeros(object_tokens_shape(1, g, 2))],
            [5],
            "cpu",
            TransferDirection.D2H,
            shape_desc(g, torch.float32),
            2,
            1,
            0,
        )
