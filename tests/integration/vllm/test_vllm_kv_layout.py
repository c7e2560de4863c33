"""Layout detection and zero-copy transfer views over vLLM KV tensors."""

from __future__ import annotations

import pytest
import torch

from lmcache.integration.vllm.vllm_kv_layout import detect_layout, transfer_views
from lmcache.v1.platform.ops_types import EngineKVFormat

NB, NH, BS, HS = 6, 2, 32, 64


def test_vllm_cpu_layout_is_viewed_without_copy() -> None:
    kv = torch.randn(NB, NH, BS, 2 * HS)
    views, layout = transfer_views({"l0": kv}, BS, NH, HS)
    assert layout.engine_kv_format == EngineKVFormat.NL_X_NB_NH_BS_TWO_HS
    view = views["l0"]
    assert view.shape == (2, NB, BS, NH, HS)
    assert view.data_ptr() == kv.data_ptr()
    assert torch.equal(view[0, 3, 5, 1], kv[3, 1, 5, :HS])  # K
    assert torch.equal(view[1, 3, 5, 1], kv[3, 1, 5, HS:])  # V
    view[1, 0, 0, 0] = 7.0
    assert bool((kv[0, 0, 0, HS:] == 7.0).all())


@pytest.mark.parametrize(
    ("shape", "fmt"),
    [
        ((2, NB, BS, NH, HS), EngineKVFormat.NL_X_TWO_NB_BS_NH_HS),
        ((NB, 2, BS, NH, HS), EngineKVFormat.NL_X_NB_TWO_BS_NH_HS),
        ((NB, BS, HS), EngineKVFormat.NL_X_NB_BS_HS),
    ],
)
def test_other_layouts(shape: tuple[int, ...], fmt: EngineKVFormat) -> None:
    assert detect_layout(torch.zeros(shape), BS, NH, HS).engine_kv_format == fmt


def test_unknown_layout_is_named() -> None:
    with pytest.raises(ValueError, match="unrecognized vLLM KV-cache layer shape"):
        detect_layout(torch.zeros(3, 3, 3, 3), BS, NH, HS)
