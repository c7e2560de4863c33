"""The shared geometry: what it reads off shapes and strides, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.kernel_kit.geometry import (
    canonical_axes,
    flatten_engine_buffers,
    geometry_from_tensors,
)
from lmcache.v1.platform.kv_formats import all_specs, format_spec
from lmcache.v1.platform.ops_types import EngineKVFormat, TransferDirection

F = EngineKVFormat


def test_every_format_has_a_record() -> None:
    assert [int(s.engine_kv_format) for s in all_specs()] == list(range(19))


def test_axes_of_a_flash_attention_layer() -> None:
    t = torch.zeros(2, 5, 4, 3, 8)  # [KV, NB, BS, NH, HS]
    axes = canonical_axes(t.shape, t.stride(), format_spec(F.NL_X_TWO_NB_BS_NH_HS), 4)
    assert axes == ((2, 480), (1, 0), (5, 96), (4, 24), (3, 8), (8, 1))


def test_fused_page_axis_and_packed_tail() -> None:
    pbs = torch.zeros(12, 2, 8)  # [NB*BS, NH, HS] with BS=4
    axes = canonical_axes(pbs.shape, pbs.stride(), format_spec(F.TWO_X_NL_X_NBBS_NH_HS), 4)
    assert axes[2:4] == ((3, 64), (4, 16))
    packed = torch.zeros(3, 2, 4, 2, 8)  # [NB, NH, BS, 2, HS] -> HS of 16
    axes = canonical_axes(packed.shape, packed.stride(), format_spec(F.NL_X_NB_NH_BS_TWO_HS), 4)
    assert axes[5] == (16, 1) and axes[4] == (2, 64)


def test_geometry_groups_layers_of_one_shape() -> None:
    layers = [torch.zeros(2, 5, 4, 3, 8) for _ in range(3)]
    geom = geometry_from_tensors(layers, format_spec(F.NL_X_TWO_NB_BS_NH_HS), 4, "kv")
    (group,) = geom.groups
    assert (geom.num_layers, geom.num_blocks, geom.block_size, geom.num_heads) == (3, 5, 4, 3)
    assert group.bases == [t.data_ptr() + k * 480 * 4 for t in layers for k in (0, 1)]
    assert (group.kv, group.layers) == ([0, 1] * 3, [0, 0, 1, 1, 2, 2])
    assert not geom.strided_head_arg
    strided = [torch.zeros(2, 5, 4, 3, 16)[..., ::2] for _ in range(2)]
    geom = geometry_from_tensors(strided, format_spec(F.NL_X_TWO_NB_BS_NH_HS), 4, "kv")
    assert geom.strided_head_arg == "kv[0]"


@pytest.mark.parametrize(
    ("fmt", "tensor", "block_size", "message"),
    [
        (F.NL_X_TWO_NB_BS_NH_HS, torch.zeros(5, 4, 3, 8), 4, "expected a 5-d engine tensor"),
        (F.TWO_X_NL_X_NBBS_NH_HS, torch.zeros(10, 2, 8), 4, "not a multiple of the block size"),
        (F.NL_X_NBBS_ONE_HS, torch.zeros(8, 2, 8), 4, "unit axis"),
        (F.NL_X_NB_NH_BS_TWO_HS, torch.zeros(3, 2, 4, 8, 2).transpose(-1, -2), 4, r"packed K\|V"),
    ],
)
def test_undescribable_buffers_are_value_errors(
    fmt: EngineKVFormat, tensor: torch.Tensor, block_size: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        canonical_axes(tensor.shape, tensor.stride(), format_spec(fmt), block_size)


def test_kv_layers_need_k_and_v() -> None:
    with pytest.raises(ValueError, match="a K and a V buffer per layer"):
        flatten_engine_buffers([torch.zeros(1)], format_spec(F.TWO_X_NL_X_NB_BS_NH_HS))


def test_the_baseline_refuses_a_strided_packed_tail_instead_of_copying_it() -> None:
    # A silent copy would lose every H2D write; the shared geometry refuses it.
    layer = torch.zeros(3, 2, 4, 8, 2).transpose(-1, -2)  # tail [2, HS] not contiguous
    with pytest.raises(ValueError, match=r"packed K\|V"):
        torch_ops.multi_layer_kv_transfer(
            torch.ones(1, 1, 2, 32), [layer], torch.tensor([0, 1]), "cpu", 0,
            TransferDirection.H2D, F.NL_X_NB_NH_BS_TWO_HS, 4,
        )  # fmt: skip
