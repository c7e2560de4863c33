"""GPU-only checks of the native kernels: bit-exact against the torch baseline in every
object placement and pointer mode, memcpy splitting, pinned/pageable fallbacks.  (CUDA IPC,
event ordering across processes and the round trip through a real server are the
conformance suite's: ``nox -s "tests(lmcache-cuda)"`` runs it for the cuda backend.)

Every test carries the ``gpu`` marker; conftest.py skips them with the reason when torch
sees no CUDA device.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from layouts import ALL_FORMATS, Shape, build_cache, clone, equal, object_tokens_shape, shape_desc

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.kv_formats import format_spec as _format_spec
from lmcache.v1.platform.ops_types import TransferDirection

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.uint8]


@pytest.fixture(scope="module")
def native() -> Any:
    from lmcache_cuda.device import CudaDeviceSpec

    ops = CudaDeviceSpec().get_ops()
    assert ops.native_module_name == "lmcache_cuda.native_ops", "native kernels not bound"
    return ops


def _flat(cache: Any) -> list[torch.Tensor]:
    if isinstance(cache, torch.Tensor):
        return [cache]
    return [t for item in cache for t in _flat(item)]


@st.composite
def cases(draw: Any) -> dict[str, Any]:
    g = Shape(
        nl=draw(st.integers(1, 4)),
        nb=draw(st.integers(2, 12)),
        bs=draw(st.sampled_from([1, 4, 16])),
        nh=draw(st.integers(1, 4)),
        hs=draw(st.sampled_from([2, 8, 64, 128])),
    )
    bpo = draw(st.integers(1, 3))
    count = draw(st.integers(1, g.nb))
    ids = list(draw(st.permutations(list(range(g.nb)))))[:count]
    if count > 1 and draw(st.booleans()):
        ids[draw(st.integers(0, count - 1))] = -1
    return {
        "fmt": draw(st.sampled_from(ALL_FORMATS)),
        "dtype": draw(st.sampled_from(DTYPES)),
        "g": g,
        "bpo": bpo,
        "ids": ids,
        "skip": draw(st.integers(0, 1)),
        "objects_on": draw(st.sampled_from(["pinned", "cuda", "pointer"])),
        "engine_pointers": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def _make_objects(case: dict[str, Any], fill: bool) -> list[torch.Tensor]:
    g: Shape = case["g"]
    shape = object_tokens_shape(case["fmt"], g, case["bpo"] * g.bs)
    n = -(-len(case["ids"]) // case["bpo"])
    gen = torch.Generator().manual_seed(case["seed"] + 7)
    out = []
    for _ in range(n):
        t = (
            torch.randint(0, 120, shape, generator=gen).to(case["dtype"])
            if fill
            else torch.zeros(shape, dtype=case["dtype"])
        )
        out.append(t.cuda() if case["objects_on"] == "cuda" else t.pin_memory())
    return out


def _call(ops: Any, case: dict[str, Any], cache: Any, objects: list[Any], direction: Any) -> None:
    g: Shape = case["g"]
    paged: Any = cache
    native = ops is not torch_ops
    if (
        native
        and case["engine_pointers"]
        and _format_spec(case["fmt"]).container != ("layer_tuples")
    ):
        paged = torch.tensor([t.data_ptr() for t in _flat(cache)], dtype=torch.int64)
    objs: list[Any] = objects
    if native and case["objects_on"] == "pointer":
        objs = [o.data_ptr() for o in objects]
    ops.multi_layer_block_kv_transfer(
        paged,
        objs,
        torch.tensor(case["ids"]),
        torch.device("cuda", 0),
        direction,
        shape_desc(g, case["dtype"]),
        case["bpo"] * g.bs,
        case["fmt"],
        case["skip"],
    )
    torch.cuda.synchronize()


@settings(max_examples=120, deadline=None)
@given(cases())
def test_block_transfer_bit_exact(native: Any, case: dict[str, Any]) -> None:
    gen = torch.Generator().manual_seed(case["seed"])
    cache = build_cache(case["fmt"], case["g"], case["dtype"], "cuda", gen)

    ours, theirs = _make_objects(case, False), _make_objects(case, False)
    _call(native, case, cache, ours, TransferDirection.D2H)
    _call(torch_ops, case, cache, theirs, TransferDirection.D2H)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.cpu(), b.cpu())

    source = _make_objects(case, True)
    ours_cache, theirs_cache = clone(cache, zero=True), clone(cache, zero=True)
    _call(native, case, ours_cache, source, TransferDirection.H2D)
    _call(torch_ops, case, theirs_cache, source, TransferDirection.H2D)
    assert equal(ours_cache, theirs_cache)


@settings(max_examples=80, deadline=None)
@given(
    fmt=st.sampled_from(ALL_FORMATS),
    dtype=st.sampled_from(DTYPES),
    nl=st.integers(1, 3),
    nb=st.integers(2, 8),
    bs=st.sampled_from([1, 16]),
    nh=st.integers(1, 4),
    hs=st.sampled_from([8, 128]),
    tokens=st.integers(1, 40),
    skip=st.integers(0, 3),
    pinned=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_token_transfer_bit_exact(
    native: Any,
    fmt: int,
    dtype: torch.dtype,
    nl: int,
    nb: int,
    bs: int,
    nh: int,
    hs: int,
    tokens: int,
    skip: int,
    pinned: bool,
    seed: int,
) -> None:
    g = Shape(nl, nb, bs, nh, hs)
    gen = torch.Generator().manual_seed(seed)
    cache = build_cache(fmt, g, dtype, "cuda", gen)
    tokens = min(tokens, nb * bs)
    slots = torch.randperm(nb * bs, generator=gen)[:tokens]
    if tokens > 2:
        slots[1] = -1
    slots = slots.cuda()
    shape = object_tokens_shape(fmt, g, tokens)

    def lmc(fill: bool) -> torch.Tensor:
        t = (
            torch.randint(0, 99, shape, generator=gen).to(dtype)
            if fill
            else torch.zeros(shape, dtype=dtype)
        )
        return t.pin_memory() if pinned else t.cuda()

    skip = min(skip, tokens)
    ours, theirs = lmc(False), lmc(False)
    for ops, out in ((native, ours), (torch_ops, theirs)):
        ops.multi_layer_kv_transfer(
            out, cache, slots, "cuda", 0, TransferDirection.D2H, fmt, bs, 0, skip
        )
    torch.cuda.synchronize()
    assert torch.equal(ours.cpu(), theirs.cpu())

    source = lmc(True)
    a, b = clone(cache, zero=True), clone(cache, zero=True)
    native.multi_layer_kv_transfer(source, a, slots, "cuda", 0, TransferDirection.H2D, fmt, bs)
    torch_ops.multi_layer_kv_transfer(source, b, slots, "cuda", 0, TransferDirection.H2D, fmt, bs)
    torch.cuda.synchronize()
    assert equal(a, b)


def test_flash_helpers_bit_exact(native: Any) -> None:
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(6, 16, 4, 64, generator=gen).to(torch.bfloat16).cuda()
    v = torch.randn(6, 16, 4, 64, generator=gen).to(torch.bfloat16).cuda()
    slots = torch.randperm(96, generator=gen)[:50].cuda()
    ours = torch.zeros(2, 3, 50, 256, dtype=torch.bfloat16).pin_memory()
    theirs = torch.zeros_like(ours)
    native.load_and_reshape_flash(ours, k, v, slots, 1)
    torch_ops.load_and_reshape_flash(theirs, k, v, slots, 1)
    torch.cuda.synchronize()
    assert torch.equal(ours, theirs)
    k2, v2 = torch.zeros_like(k), torch.zeros_like(v)
    k3, v3 = torch.zeros_like(k), torch.zeros_like(v)
    native.reshape_and_cache_back_flash(ours, k2, v2, slots, 1)
    torch_ops.reshape_and_cache_back_flash(ours, k3, v3, slots, 1)
    torch.cuda.synchronize()
    assert torch.equal(k2, k3) and torch.equal(v2, v3)


@pytest.mark.parametrize("direction", [TransferDirection.D2H, TransferDirection.H2D])
def test_memcpy_async_splits_at_host_alignment(native: Any, direction: Any) -> None:
    nbytes = 3 * 4096 + 123
    device = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    host = torch.zeros(nbytes, dtype=torch.uint8).pin_memory()
    if direction == TransferDirection.D2H:
        native.lmcache_memcpy_async(
            host.data_ptr(), device.data_ptr(), nbytes, direction, 100, 4096
        )
    else:
        host.copy_(device.cpu())
        device.zero_()
        native.lmcache_memcpy_async(
            device.data_ptr(), host.data_ptr(), nbytes, direction, 100, 4096
        )
    torch.cuda.synchronize()
    assert torch.equal(host, device.cpu())


def test_unpinned_host_objects_fall_back_to_the_baseline(native: Any) -> None:
    g = Shape(nl=2, nb=4, bs=4, nh=2, hs=8)
    cache = build_cache(1, g, torch.float16, "cuda", torch.Generator().manual_seed(1))
    pageable = [torch.zeros(object_tokens_shape(1, g, 8), dtype=torch.float16)]
    native.multi_layer_block_kv_transfer(
        cache, pageable, [2, 3], "cuda", TransferDirection.D2H, shape_desc(g, torch.float16),
        8, 1, 0,
    )  # fmt: skip
    torch.cuda.synchronize()
    assert torch.equal(pageable[0][0, 0, :4].view(4, 2, 8).cuda(), cache[0][0, 2])
