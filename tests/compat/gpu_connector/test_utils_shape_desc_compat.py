"""The page-buffer shape-descriptor helpers of ``lmcache.v1.gpu_connector.utils``.

Upstream's own tests pin single cases; these pin that the descriptor agrees with the
transfer kernels' reading of the tensors for every format, that a padded block stride
survives into a pointer-mode transfer (the bytes moved are the right ones), and the
refusals.
"""

from __future__ import annotations

import logging

import pytest
import torch

from lmcache.compat.upstream_056.gpu_connector.utils import (
    get_concrete_engine_kv_shape,
    get_concrete_engine_kv_shape_from_shape_desc,
    make_page_buffer_shape_desc,
    resolve_block_stride_and_log_layout,
)
from lmcache.v1.platform.kv_formats import EngineKVFormat as F
from lmcache.v1.platform.kv_formats import format_spec
from lmcache.v1.platform.kv_geometry import geometry_from_tensors
from lmcache.v1.platform.ops_types import PageBufferShapeDesc, TransferDirection
from lmcache.v1.platform.torch_ops import multi_layer_block_kv_transfer
from tests.compat.gpu_connector.test_kv_format_specs_compat import BS, BUILDERS, NB, NL

# Formats whose template names a size a PageBufferShapeDesc does not hold.
NOT_DESCRIBABLE = {
    F.NL_X_NB_NH_BS_CS,
    F.NL_X_NB_BS_NH_CS,
    F.NL_X_NB_BSV_BSS,
}


@pytest.mark.parametrize("fmt", list(BUILDERS), ids=lambda f: f.name)
def test_shape_desc_agrees_with_the_kernels_reading(fmt: F) -> None:
    kv = BUILDERS[fmt]()
    desc = make_page_buffer_shape_desc(kv, fmt, 0, NL, NB, BS)
    geom = geometry_from_tensors(kv, format_spec(fmt), 0, "kv_caches")
    assert (desc.nl, desc.nb, desc.bs) == (NL, NB, BS)
    assert desc.kv_size == geom.kv_size
    assert desc.dtype == geom.dtype
    assert desc.element_size == geom.itemsize
    assert desc.block_stride_elems == 0
    if format_spec(fmt).mla:
        assert desc.nh == 1
    else:
        assert (desc.nh, desc.hs) == (geom.num_heads, geom.head_width)


@pytest.mark.parametrize("fmt", list(BUILDERS), ids=lambda f: f.name)
def test_concrete_shape_from_desc_matches_the_whole_cache_reading(fmt: F) -> None:
    kv = BUILDERS[fmt]()
    desc = make_page_buffer_shape_desc(kv, fmt, 0, NL, NB, BS)
    from_desc = get_concrete_engine_kv_shape_from_shape_desc(desc, fmt)
    if fmt in NOT_DESCRIBABLE:
        assert from_desc == f"Unknown ({fmt})"
    else:
        assert from_desc == get_concrete_engine_kv_shape(kv, fmt)


def test_concrete_shape_from_desc_of_an_unknown_format() -> None:
    assert get_concrete_engine_kv_shape_from_shape_desc(PageBufferShapeDesc(), 99) == (
        "Unknown (99)"
    )


def _padded_mla_pool(row: int, hs: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """NL layers of [NB, BS, hs] whose blocks sit ``row`` elements apart in one pool."""
    pool = torch.arange(NL * NB * row, dtype=torch.float32).reshape(NL, NB, row)
    views = [pool[layer, :, : BS * hs].view(NB, BS, hs) for layer in range(NL)]
    return pool, views


def test_padded_block_stride_reaches_a_pointer_mode_transfer(caplog) -> None:
    hs, row = 8, BS * 8 + 24  # 24 elements of padding after every block
    _pool, views = _padded_mla_pool(row, hs)
    with caplog.at_level(logging.INFO, logger="lmcache.compat.upstream_056.gpu_connector.utils"):
        stride = resolve_block_stride_and_log_layout(views, F.NL_X_NB_BS_HS, 0, 0)
    assert stride == row
    assert "padding_per_block=24" in caplog.text
    desc = make_page_buffer_shape_desc(views, F.NL_X_NB_BS_HS, 0, NL, NB, BS, stride)
    assert desc.block_stride_elems == row
    pointers = torch.tensor([v.data_ptr() for v in views], dtype=torch.int64)
    block_ids = [3, 1]
    obj = torch.full((NL, 2 * BS, hs), -1.0)
    multi_layer_block_kv_transfer(
        pointers, [obj], block_ids, "cpu", TransferDirection.D2H, desc, 2 * BS,
        F.NL_X_NB_BS_HS, 0,
    )  # fmt: skip
    expected = torch.stack([torch.cat([v[b] for b in block_ids]) for v in views])
    assert torch.equal(obj, expected)


def test_non_block_axis_format_returns_none_and_refuses_padding() -> None:
    kv = BUILDERS[F.NL_X_TWO_NB_BS_NH_HS]()
    assert resolve_block_stride_and_log_layout(kv, F.NL_X_TWO_NB_BS_NH_HS, 1, 0) is None
    plane = NB * BS * 2 * 4
    base = torch.zeros(2 * (plane + 16))
    # K and V planes 16 elements apart: padding on dim 0, which is not the block axis here.
    padded = [base.as_strided((2, NB, BS, 2, 4), (plane + 16, BS * 8, 8, 4, 1))] * NL
    with pytest.raises(ValueError, match="dim-0 padding"):
        resolve_block_stride_and_log_layout(padded, F.NL_X_TWO_NB_BS_NH_HS, 0, 2)


def test_cross_layer_format_needs_one_backing_tensor() -> None:
    kv = BUILDERS[F.NB_NL_TWO_BS_NH_HS]()
    assert resolve_block_stride_and_log_layout(kv, F.NB_NL_TWO_BS_NH_HS, 0, 0) is None
    with pytest.raises(TypeError, match="one backing torch"):
        resolve_block_stride_and_log_layout([kv], F.NB_NL_TWO_BS_NH_HS, 0, 0)
