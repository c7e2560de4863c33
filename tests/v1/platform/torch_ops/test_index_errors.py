"""Out-of-range engine block ids and slots raise ``KVIndexError`` before writing."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lmcache.v1.platform.ops_types import (
    EngineKVFormat,
    KVIndexError,
    PageBufferShapeDesc,
    TransferDirection,
)

NL, NB, BS, NH, HS = 2, 4, 16, 2, 8


def _layers() -> list[torch.Tensor]:
    return [torch.randn(2, NB, BS, NH, HS) for _ in range(NL)]


def _desc() -> PageBufferShapeDesc:
    desc = PageBufferShapeDesc()
    desc.kv_size, desc.nl, desc.nb, desc.bs, desc.nh, desc.hs = 2, NL, NB, BS, NH, HS
    desc.element_size, desc.dtype = 4, torch.float32
    return desc


def test_kv_index_error_is_both_index_and_value_error() -> None:
    assert issubclass(KVIndexError, IndexError) and issubclass(KVIndexError, ValueError)


@pytest.mark.parametrize("bad_block", [NB, NB + 7])
def test_block_id_out_of_range_leaves_destination_untouched(ops: Any, bad_block: int) -> None:
    layers = _layers()
    before = [t.clone() for t in layers]
    obj = torch.randn(2, NL, 2 * BS, NH * HS)
    with pytest.raises(IndexError, match="out of range"):
        ops.multi_layer_block_kv_transfer(
            layers,
            [obj],
            [0, bad_block],
            "cpu",
            TransferDirection.H2D,
            _desc(),
            2 * BS,
            EngineKVFormat.NL_X_TWO_NB_BS_NH_HS,
            0,
        )
    assert all(torch.equal(a, b) for a, b in zip(layers, before))


def test_slot_out_of_range_raises_index_error(ops: Any) -> None:
    layers = _layers()
    key_value = torch.randn(2, NL, 3, NH * HS)
    slots = torch.tensor([0, 1, NB * BS])
    with pytest.raises(IndexError, match="out of range"):
        ops.multi_layer_kv_transfer(
            key_value,
            layers,
            slots,
            torch.device("cpu"),
            NB * BS,
            TransferDirection.H2D,
            EngineKVFormat.NL_X_TWO_NB_BS_NH_HS,
            BS,
            HS,
        )
