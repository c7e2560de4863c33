"""Block checksums at upstream's ``http_apis.cache_api`` path: format-derived block axes,
dtypes numpy lacks, and argument checks (upstream's own tests cover the digests)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from lmcache.compat.upstream_056.http_apis.cache_api import (
    block_axes_for_formats,
    block_axis_for_format,
    compute_block_checksums,
)
from lmcache.v1.platform.kv_formats import EngineKVFormat as F


def test_block_axis_follows_the_format_table() -> None:
    assert block_axis_for_format(F.NL_X_TWO_NB_BS_NH_HS) == 1
    assert block_axis_for_format(F.NL_X_NB_TWO_BS_NH_HS) == 0
    assert block_axis_for_format(F.NL_X_NB_BS_HS) == 0
    assert block_axis_for_format(F.NL_X_TWO_NB_NH_BS_HS) == 1
    # fused NB*BS page buffers and cross-layer buffers are not block-addressable
    assert block_axis_for_format(F.NL_X_NBBS_ONE_HS) is None
    assert block_axis_for_format(F.NB_NL_TWO_BS_NH_HS) is None


def test_kv_sharing_layers_inherit_a_single_formats_axis() -> None:
    fmt = F.NL_X_TWO_NB_BS_NH_HS
    assert block_axes_for_formats([fmt, None, fmt]) == [1, 1, 1]
    assert block_axes_for_formats([F.NL_X_NB_BS_HS, F.NL_X_TWO_NB_BS_NH_HS]) == [0, 1]
    with pytest.raises(ValueError, match="mixed-format"):
        block_axes_for_formats([F.NL_X_NB_BS_HS, None, F.NL_X_TWO_NB_BS_NH_HS])
    with pytest.raises(ValueError, match="not supported"):
        block_axes_for_formats([F.NL_X_NBBS_ONE_HS])


def test_fp8_is_hashed_as_raw_bytes() -> None:
    kv = torch.randn(3, 4, 8).to(torch.float8_e4m3fn)
    out = compute_block_checksums([kv], [2, 0], [0], chunk_size=2, layerwise=False)
    raw = kv.view(torch.uint8).index_select(0, torch.tensor([2, 0])).contiguous()
    assert out["chunk_checksums"] == [hashlib.md5(raw.numpy().tobytes()).hexdigest()]


def test_layerwise_digests_are_per_layer_slices() -> None:
    layers = [torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) + i for i in range(2)]
    out = compute_block_checksums(layers, [0, 2, 1], [1, 1], chunk_size=2, layerwise=True)
    assert out["num_chunks"] == 2
    tail = layers[1][:, 1:2].contiguous()  # layer 1's last chunk: block 1 alone
    assert out["chunk_checksums"]["layer_1"][1] == hashlib.md5(tail.numpy().tobytes()).hexdigest()


def test_argument_checks() -> None:
    kv = [torch.zeros(2, 2)]
    with pytest.raises(ValueError, match="chunk_size"):
        compute_block_checksums(kv, [0], [0], chunk_size=0, layerwise=False)
    with pytest.raises(ValueError, match="block axes"):
        compute_block_checksums(kv, [0], [0, 0], chunk_size=1, layerwise=False)
