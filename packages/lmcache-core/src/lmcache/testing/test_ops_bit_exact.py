"""The backend's ops against the torch baseline, byte for byte, across dtypes and every
``EngineKVFormat`` (the baseline is ``lmcache.v1.platform.torch_ops``)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmcache.testing import EXAMPLES_ENV_VAR
from lmcache.testing.kv_layouts import (
    DTYPES,
    Geometry,
    assert_same,
    build_cache,
    clone,
    flat_tensors,
    random_factory,
    shape_desc,
)
from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.kv_formats import all_specs
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc, TransferDirection

ALL_FORMATS = sorted(int(s.engine_kv_format) for s in all_specs())
EXAMPLES = int(os.environ.get(EXAMPLES_ENV_VAR, "60"))


@st.composite
def block_cases(draw: st.DrawFn) -> dict[str, Any]:
    g = Geometry(
        nl=draw(st.integers(1, 3)),
        nb=draw(st.integers(1, 9)),
        bs=draw(st.sampled_from([1, 3, 4, 16])),  # odd block sizes too
        nh=draw(st.integers(1, 3)),
        hs=draw(st.sampled_from([1, 2, 5, 8])),
    )
    bpo = draw(st.integers(1, 4))
    ids = draw(st.permutations(range(g.nb)))[: draw(st.integers(0, 3 * bpo))]  # 0: empty
    ids = [b if b % 3 or not draw(st.booleans()) else -1 for b in ids]  # padding holes
    return {
        "fmt": draw(st.sampled_from(ALL_FORMATS)),
        "g": g,
        "dtype": draw(st.sampled_from(DTYPES)),
        "bpo": bpo,
        "ids": ids,
        "skip": draw(st.integers(0, len(ids))),
        "direction": draw(st.sampled_from(list(TransferDirection))),
        "seed": draw(st.integers(0, 2**16)),
    }


def _block_transfer(op: Any, case: dict[str, Any], cache: Any, objects: Any, device: str) -> None:
    g, fmt = case["g"], case["fmt"]
    desc = shape_desc(fmt, g, case["dtype"])
    op(cache, objects, list(case["ids"]), device, case["direction"], desc, case["bpo"] * g.bs,
       fmt, case["skip"])  # fmt: skip


def _objects(case: dict[str, Any], new: Any) -> list[torch.Tensor]:
    g = case["g"]
    n_objects = max(1, -(-len(case["ids"]) // case["bpo"]))
    return [new(g.object_shape(case["fmt"], case["bpo"] * g.bs)) for _ in range(n_objects)]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=block_cases())
def test_block_transfer_matches_baseline(ops: Any, device: str, case: dict[str, Any]) -> None:
    new = random_factory(case["dtype"], case["seed"], device)
    cache = build_cache(case["fmt"], case["g"], new)
    objects = _objects(case, new)
    ref_cache, ref_objects = clone(cache), clone(objects)
    outcome: list[tuple[type, str] | None] = []
    for op, c, o in (
        (torch_ops.multi_layer_block_kv_transfer, ref_cache, ref_objects),
        (ops.multi_layer_block_kv_transfer, cache, objects),
    ):
        try:
            _block_transfer(op, case, c, o, device)
            outcome.append(None)
        except (ValueError, TypeError, IndexError) as exc:
            outcome.append((type(exc), str(exc)))
    assert outcome[0] == outcome[1], "the backend and the baseline disagree on the error"
    assert_same(cache, ref_cache)
    assert_same(objects, ref_objects)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_every_format_round_trips(ops: Any, device: str, fmt: int, dtype: torch.dtype) -> None:
    """D2H then H2D into a zeroed cache gives back exactly the gathered blocks."""
    g = Geometry(nl=2, nb=7, bs=4, nh=2, hs=8)
    cache = build_cache(fmt, g, random_factory(dtype, fmt, device))
    case = {"fmt": fmt, "g": g, "dtype": dtype, "bpo": 3, "ids": [6, 1, -1, 4, 0], "skip": 1}
    objects = [torch.zeros(g.object_shape(fmt, 12), dtype=dtype, device=device) for _ in "ab"]
    ref_objects = clone(objects)
    d2h = {**case, "direction": TransferDirection.D2H}
    _block_transfer(ops.multi_layer_block_kv_transfer, d2h, cache, objects, device)
    _block_transfer(torch_ops.multi_layer_block_kv_transfer, d2h, cache, ref_objects, device)
    assert_same(objects, ref_objects)
    assert any(o.any() for o in objects), "nothing was gathered"
    restored, ref_restored = clone(cache), clone(cache)
    for t in flat_tensors(restored) + flat_tensors(ref_restored):
        t.zero_()
    h2d = {**case, "direction": TransferDirection.H2D}
    _block_transfer(ops.multi_layer_block_kv_transfer, h2d, restored, objects, device)
    _block_transfer(torch_ops.multi_layer_block_kv_transfer, h2d, ref_restored, ref_objects,
                    device)  # fmt: skip
    assert_same(restored, ref_restored)


@pytest.mark.parametrize("nbytes", [0, 1, 7, 4096, 65537])
def test_memcpy_matches_baseline(ops: Any, available_spec: Any, device: str, nbytes: int) -> None:
    src = torch.randint(0, 256, (nbytes + 16,), dtype=torch.uint8).to(device)
    dst = torch.zeros(nbytes + 16, dtype=torch.uint8, device=device)
    ref = dst.clone()
    ops.lmcache_memcpy_async(dst, src, nbytes, TransferDirection.D2H, 0, 0)
    torch_ops.lmcache_memcpy_async(ref, src, nbytes, TransferDirection.D2H, 0, 0)
    if device != "cpu":  # "async": complete once the device is synchronized
        available_spec.synchronize_device()
    assert torch.equal(dst.cpu(), ref.cpu())
    assert torch.equal(dst.cpu()[:nbytes], src.cpu()[:nbytes])


@pytest.mark.parametrize("widths", [(8, 1), (3, 2, 5)], ids=str)
def test_mixed_dtype_mla_planes_match_baseline(
    ops: Any, device: str, widths: tuple[int, ...]
) -> None:
    """MLA plane tuples of mixed dtypes (int8 latent + float16 scale) pack by bytes."""
    dtypes = [torch.int8, torch.float16, torch.bfloat16][: len(widths)]
    nl, nb, bs, bpo = 2, 5, 3, 2
    gen = torch.Generator().manual_seed(sum(widths))
    sizes = [torch.empty(0, dtype=d).element_size() for d in dtypes]
    layers = [
        tuple(
            torch.randint(0, 256, (nb, bs, 1, w * s), dtype=torch.uint8, generator=gen)
            .view(d)
            .to(device)
            for w, s, d in zip(widths, sizes, dtypes)
        )
        for _ in range(nl)
    ]
    row = sum(w * s for w, s in zip(widths, sizes))
    desc = PageBufferShapeDesc(kv_size=1, nl=nl, nb=nb, bs=bs, nh=1, hs=row, element_size=1,
                               dtype=torch.int8)  # fmt: skip
    fmt, ids = EngineKVFormat.NL_X_NP_X_NB_BS_ONE_HS, [4, -1, 0, 2, 1]
    objects = [torch.zeros(nl, bpo * bs, row, dtype=torch.int8, device=device) for _ in "abc"]
    ref_objects = clone(objects)
    for op, objs in ((ops, objects), (torch_ops, ref_objects)):
        op.multi_layer_block_kv_transfer(layers, objs, ids, device, TransferDirection.D2H, desc,
                                         bpo * bs, fmt, 1)  # fmt: skip
    assert_same(objects, ref_objects)
    assert any(o.any() for o in objects), "nothing was gathered"
    restored = [tuple(torch.zeros_like(p) for p in planes) for planes in layers]
    ref_restored = [tuple(torch.zeros_like(p) for p in planes) for planes in layers]
    for op, target in ((ops, restored), (torch_ops, ref_restored)):
        op.multi_layer_block_kv_transfer(target, objects, ids, device, TransferDirection.H2D,
                                         desc, bpo * bs, fmt, 1)  # fmt: skip
    assert_same(
        [p.view(torch.uint8) for planes in restored for p in planes],
        [p.view(torch.uint8) for planes in ref_restored for p in planes],
    )


def test_cross_layer_format_given_per_layer_matches_baseline(ops: Any, device: str) -> None:
    """NB_NL_TWO_BS_NH_HS given one buffer per layer reads like NL_X_TWO_NB_BS_NH_HS."""
    g = Geometry(nl=3, nb=4, bs=3, nh=2, hs=5)
    fmt = EngineKVFormat.NL_X_TWO_NB_BS_NH_HS
    cache = build_cache(int(fmt), g, random_factory(torch.float16, 3, device))
    slots = torch.tensor([11, 0, -1, 7, 4], device=device)
    cross = EngineKVFormat.NB_NL_TWO_BS_NH_HS
    ours = torch.zeros(2, g.nl, 5, g.nh * g.hs, dtype=torch.float16, device=device)
    ref = ours.clone()
    for op, out in ((ops, ours), (torch_ops, ref)):
        op.multi_layer_kv_transfer(out, cache, slots, torch.device(device), g.nb * g.bs,
                                   TransferDirection.D2H, cross, g.bs)  # fmt: skip
    assert_same(ours, ref)
    assert bool(ours.any()), "nothing was gathered"
