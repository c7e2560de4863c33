"""``as_nhd_view`` / ``declared_kv_layout``: upstream's ``layout_hints`` read without copies."""

from __future__ import annotations

import pytest
import torch

from lmcache.v1.platform.kv_layout import KVLayout, as_nhd_view, declared_kv_layout

NB, BS, NH, HS = 5, 4, 3, 6


def _reference() -> torch.Tensor:
    return torch.arange(2 * NB * BS * NH * HS, dtype=torch.float32).view(2, NB, BS, NH, HS)


ENGINE_FORMS = {
    "two_major": lambda t: t.transpose(2, 3).contiguous(),
    "blocks_first": lambda t: t.permute(1, 0, 3, 2, 4).contiguous(),
    "vllm_cpu_fused": lambda t: t.permute(1, 3, 2, 0, 4).flatten(3).contiguous(),
}


@pytest.mark.parametrize("form", sorted(ENGINE_FORMS))
def test_hnd_forms_view_as_the_same_nhd_values_sharing_memory(form: str) -> None:
    reference = _reference()
    engine = ENGINE_FORMS[form](reference)
    view = as_nhd_view(engine, "HND")
    assert view.shape == reference.shape
    assert torch.equal(view, reference)
    assert view.untyped_storage().data_ptr() == engine.untyped_storage().data_ptr()
    layout = KVLayout.from_tensors([view])
    assert (layout.num_blocks, layout.block_size, layout.num_heads) == (NB, BS, NH)


@pytest.mark.parametrize("kv_layout", [None, "NHD"])
def test_nhd_or_undeclared_is_taken_as_is(kv_layout: str | None) -> None:
    tensor = _reference()
    assert as_nhd_view(tensor, kv_layout) is tensor


def test_mla_passes_through_whatever_the_declared_layout() -> None:
    mla = torch.zeros(NB, BS, HS)
    assert as_nhd_view(mla, "HND") is mla


def test_unknown_layout_and_unreadable_shapes_raise() -> None:
    with pytest.raises(ValueError, match="BLHNC"):
        as_nhd_view(_reference(), "BLHNC")
    with pytest.raises(ValueError, match="unsupported HND"):
        as_nhd_view(torch.zeros(NB, NH, BS, 7), "HND")  # odd fused width: no K|V split


def test_declared_kv_layout_reads_upstream_hints() -> None:
    assert declared_kv_layout({"kv_layout": "HND"}) == "HND"
    assert declared_kv_layout({}) is None
    assert declared_kv_layout(None) is None
    with pytest.raises(TypeError, match="must be a string"):
        declared_kv_layout({"kv_layout": 1})


# -- upstream's kv_list_layout="unified" (SGLang: one tensor per K or V plane) ------------


def test_unified_list_views_each_plane_as_a_single_plane_layer_sharing_memory() -> None:
    from lmcache.v1.platform.kv_layout import as_layer_views

    planes = [torch.randn(4, 16, 2, 8) for _ in range(4)]  # [NB, BS, NH, HS], K0 K1 V0 V1
    views = as_layer_views(planes, {"kv_list_layout": "unified"})
    assert [tuple(v.shape) for v in views] == [(4, 16, 16)] * 4
    assert all(v.data_ptr() == p.data_ptr() for v, p in zip(views, planes, strict=True))
    layout = KVLayout.from_tensors(views)
    assert layout.use_mla and layout.num_layers == 4
    # already flat planes ([NB, BS, width]) pass as they are
    assert as_layer_views(views, {"kv_list_layout": "unified"})[0] is views[0]


def test_unified_chunk_holds_the_bytes_of_a_per_layer_chunk() -> None:
    """A chunk gathered from the unified planes equals the chunk of the same KV registered
    per layer as [2, NB, BS, NH, HS]: every K plane, then every V plane."""
    from lmcache.v1.multiprocess.transfer_context.base import gather_paged_kv_to_cpu

    nb, bs, nh, hs, layers = 4, 16, 2, 8, 2
    keys = [torch.randn(nb, bs, nh, hs) for _ in range(layers)]
    values = [torch.randn(nb, bs, nh, hs) for _ in range(layers)]
    per_layer = [torch.stack([k, v]) for k, v in zip(keys, values, strict=True)]
    blocks = [2, 0, 3, 1]
    unified = gather_paged_kv_to_cpu(
        [*keys, *values], blocks, 4, layout_hints={"kv_list_layout": "unified"}
    )[0]
    vllm = gather_paged_kv_to_cpu(per_layer, blocks, 4)[0]
    assert unified.numel() == vllm.numel()
    assert torch.equal(unified.reshape(-1), vllm.reshape(-1))


def test_unknown_kv_list_layout_and_bad_planes_raise() -> None:
    from lmcache.v1.platform.kv_layout import as_layer_views, declared_kv_list_layout

    assert declared_kv_list_layout(None) is None
    assert declared_kv_list_layout({"kv_layout": "NHD"}) is None
    with pytest.raises(ValueError, match="kv_list_layout"):
        declared_kv_list_layout({"kv_list_layout": "sideways"})
    with pytest.raises(ValueError, match="unified KV list"):
        as_layer_views([torch.zeros(2, 2, 2, 2, 2)], {"kv_list_layout": "unified"})


def test_cpu_cache_context_honors_the_unified_hint() -> None:
    """The server side of LMCache-driven transfer (upstream's SGLang connector registers
    ``[NB, BS, NH, HS]`` planes with the hint)."""
    from lmcache.v1.platform.cpu.cache_context import CPUCacheContext

    planes = [torch.randn(4, 16, 2, 8) for _ in range(4)]
    context = CPUCacheContext(planes, 64, layout_hints={"kv_list_layout": "unified"})
    try:
        assert context.num_layers == 4
    finally:
        context.close()


def test_k_v_list_pages_token_slot_planes_by_the_hint() -> None:
    """Upstream's older SGLang adapter: ``[slots, NH, HS]`` planes + tokens_per_block."""
    from lmcache.v1.platform.kv_layout import as_layer_views

    planes = [torch.randn(64, 2, 8) for _ in range(4)]
    hints = {"kv_list_layout": "k_v", "tokens_per_block": 16}
    views = as_layer_views(planes, hints)
    assert [tuple(v.shape) for v in views] == [(4, 16, 16)] * 4
    assert torch.equal(views[1][2, 3], planes[1][2 * 16 + 3].reshape(-1))
    with pytest.raises(ValueError, match="tokens_per_block"):
        as_layer_views(planes, {"kv_list_layout": "k_v"})
    with pytest.raises(ValueError, match="k_v KV list"):
        as_layer_views([torch.randn(60, 2, 8)], hints)
