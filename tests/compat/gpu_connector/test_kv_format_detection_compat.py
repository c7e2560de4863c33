"""``detect_format`` and contiguous-view recovery beyond upstream's own detection tests:
zero-copy guarantees, refused strides, hint handling and the engine-specific reshapes."""

from __future__ import annotations

import pytest
import torch

from lmcache.compat.upstream_056.gpu_connector import utils
from lmcache.compat.upstream_056.gpu_connector.kv_format import detect_format, get_spec
from lmcache.compat.upstream_056.gpu_connector.kv_format.contiguity import (
    attempt_permute_to_contiguous_view,
    dim0_padding_elems,
)
from lmcache.compat.upstream_056.gpu_connector.kv_format.detectors import vllm as vllm_detector
from lmcache.utils import EngineType
from lmcache.v1.platform.kv_formats import EngineKVFormat as F

NL, NB, BS, NH, HS = 3, 5, 4, 2, 8


def _t(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


@pytest.fixture
def gpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_detector, "torch_device_type", "cuda")


def test_permuted_view_is_recovered_without_copy(gpu_host: None) -> None:
    # vLLM HND: allocated [2, NB, NH, BS, HS], exposed as [2, NB, BS, NH, HS].
    physical = [_t(2, NB, NH, BS, HS) for _ in range(NL)]
    exposed = [t.transpose(2, 3) for t in physical]
    fmt, out = detect_format(exposed, EngineType.VLLM, {"kv_layout": "HND"})
    assert fmt == F.NL_X_TWO_NB_NH_BS_HS
    assert tuple(out[0].shape) == (2, NB, NH, BS, HS) and out[0].is_contiguous()
    assert out[0].data_ptr() == physical[0].data_ptr()
    spec = get_spec(out, fmt)
    assert (spec.num_heads(), spec.block_size(), spec.head_size()) == (NH, BS, HS)


def test_block_padding_is_accepted_and_other_strides_refused() -> None:
    pool = _t(NB, BS * HS + 16)
    padded = pool[:, : BS * HS].view(NB, BS, HS)  # 16 spare elements after each block
    assert dim0_padding_elems(padded) == 16
    assert attempt_permute_to_contiguous_view(padded).data_ptr() == pool.data_ptr()
    inner = _t(NB, BS, HS + 4)[:, :, :HS]  # padding inside every row
    with pytest.raises(ValueError, match="padding inside axis"):
        attempt_permute_to_contiguous_view([inner])
    # Tuples come back as lists of the same tensors.
    pair = (_t(NB, BS, NH, HS), _t(NB, BS, NH, HS))
    out = attempt_permute_to_contiguous_view([pair])
    assert isinstance(out[0], list) and out[0][1].data_ptr() == pair[1].data_ptr()


def test_vllm_layout_hint_handling(monkeypatch: pytest.MonkeyPatch) -> None:
    kv = [_t(NB, 2, BS, NH, HS) for _ in range(NL)]
    monkeypatch.setattr(vllm_detector, "torch_device_type", "cpu")
    # Registrations without a hint meant HND on the CPU backend ...
    assert detect_format(kv, EngineType.VLLM)[0] == F.NL_X_NB_TWO_NH_BS_HS
    monkeypatch.setattr(vllm_detector, "torch_device_type", "cuda")
    # ... and NHD elsewhere; BLNHC is NHD too.
    assert detect_format(kv, EngineType.VLLM)[0] == F.NL_X_NB_TWO_BS_NH_HS
    assert detect_format(kv, EngineType.VLLM, {"kv_layout": "BLHNC"})[0] == (F.NL_X_NB_TWO_NH_BS_HS)
    with pytest.raises(ValueError, match="not supported"):
        detect_format(kv, EngineType.VLLM, {"kv_layout": "XYZ"})  # type: ignore[typeddict-item]


def test_vllm_dsa_indexer_planes(gpu_host: None) -> None:
    rank3 = [_t(NB, BS, 132, dtype=torch.uint8) for _ in range(NL)]
    assert detect_format(rank3, EngineType.VLLM)[0] == F.NL_X_NB_BSV_BSS
    # Newer vLLM adds a unit head axis; it is squeezed away (same memory).
    rank4 = [_t(NB, BS, 1, 132, dtype=torch.uint8) for _ in range(NL)]
    fmt, out = detect_format(rank4, EngineType.VLLM, {"kv_layout": "NHD"})
    assert fmt == F.NL_X_NB_BSV_BSS
    assert tuple(out[0].shape) == (NB, BS, 132) and out[0].data_ptr() == rank4[0].data_ptr()
    # A uint8 cache of another width is fused K|V, not an indexer.
    other = [_t(NB, BS, 1, 128, dtype=torch.uint8) for _ in range(NL)]
    assert detect_format(other, EngineType.VLLM, {"kv_layout": "NHD"})[0] == F.NL_X_NB_BS_NH_CS


def test_sglang_mp_mla_splits_the_page_axis() -> None:
    kv = [_t(NB * BS, 1, HS) for _ in range(NL)]
    fmt, out = detect_format(kv, EngineType.SGLANG, {"tokens_per_block": BS})
    assert fmt == F.NL_X_NB_BS_HS
    assert tuple(out[0].shape) == (NB, BS, HS) and out[0].data_ptr() == kv[0].data_ptr()
    with pytest.raises(ValueError, match="not divisible"):
        detect_format(kv, EngineType.SGLANG, {"tokens_per_block": 3})


def test_trtllm_pool_is_reviewed_by_its_hints() -> None:
    pool = _t(NB, NL, 2, NH * BS * HS)
    hints = {"num_kv_heads": NH, "tokens_per_block": BS, "head_dim": HS}
    fmt, out = detect_format([pool], EngineType.TRTLLM, hints)  # type: ignore[arg-type]
    assert fmt == F.NB_NL_TWO_NH_BS_HS
    assert tuple(out.shape) == (NB, NL, 2, NH, BS, HS) and out.data_ptr() == pool.data_ptr()
    assert get_spec(out, fmt).num_layers() == NL
    with pytest.raises(ValueError, match="needs layout_hints"):
        detect_format(pool, EngineType.TRTLLM, {"num_kv_heads": NH})
    with pytest.raises(ValueError, match="pool row"):
        detect_format(pool, EngineType.TRTLLM, {**hints, "head_dim": HS + 1})  # type: ignore[typeddict-item]


def test_engines_without_a_detector_and_unknown_structures() -> None:
    kv = [_t(NB, BS, HS) for _ in range(NL)]
    assert detect_format(kv, EngineType.ATOM)[0] == F.NL_X_NB_BS_HS
    with pytest.raises(ValueError, match="no KV cache detector"):
        detect_format(kv, EngineType.MOCK)
    with pytest.raises(ValueError, match="unsupported kv_caches structure"):
        detect_format([_t(NB, BS, NH, HS, 2, 2)], EngineType.ATOM)
    with pytest.raises(ValueError, match="empty list"):
        detect_format([[]], EngineType.VLLM)


def test_per_layer_formats_of_a_mixed_model(gpu_host: None) -> None:
    # Layers 0 and 2: split K/V; layer 1: a key-only MLA-style index cache.
    kv = [_t(2, NB, BS, NH, HS), _t(NB, BS, HS), _t(2, NB, BS, NH, HS)]
    normalized, formats = utils.normalize_and_discover_per_layer_formats(
        kv, [], EngineType.VLLM, {"kv_layout": "NHD"}
    )
    assert formats == [F.NL_X_TWO_NB_BS_NH_HS, F.NL_X_NB_BS_HS, F.NL_X_TWO_NB_BS_NH_HS]
    assert [t.data_ptr() for t in normalized] == [t.data_ptr() for t in kv]
    # A layer outside every group keeps its tensor and borrows a detected format.
    normalized, formats = utils.normalize_and_discover_per_layer_formats(
        kv, [[0, 2]], EngineType.VLLM, {"kv_layout": "NHD"}
    )
    assert normalized[1] is kv[1] and formats[1] == F.NL_X_TWO_NB_BS_NH_HS
    # A uniform cross-layer cache is detected whole.
    cross = _t(NB, NL, 2, BS, NH, HS)
    _, formats = utils.normalize_and_discover_per_layer_formats(cross, [], EngineType.VLLM)
    assert formats == [F.NB_NL_TWO_BS_NH_HS] * NL
