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
