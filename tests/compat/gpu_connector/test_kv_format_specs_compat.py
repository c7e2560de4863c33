"""The upstream-path spec classes of ``lmcache.v1.gpu_connector.kv_format``.

Upstream's own golden tests pin the per-format numbers; these pin what lmcache-core adds:
the classes are generated from the platform's format table (so they can never disagree
with it), geometry agrees with the transfer kernels' reading (``kv_geometry``), and the
cases upstream does not cover (per-layer sizes, mixed-dtype plane tuples, flat K/V lists,
pointer order).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import lmcache.compat.upstream_056.lmcache_native as lmcache_native
from lmcache.compat.upstream_056.gpu_connector import utils
from lmcache.compat.upstream_056.gpu_connector.kv_format import (
    KVFormatSpec,
    describe_shape,
    extract_kv_cache_shapes,
    get_spec,
    get_spec_class,
)
from lmcache.compat.upstream_056.gpu_connector.kv_format.specs import registry
from lmcache.v1.platform.kv_formats import EngineKVFormat as F
from lmcache.v1.platform.kv_formats import all_specs, format_spec
from lmcache.v1.platform.kv_geometry import geometry_from_tensors

NL, NB, BS, NH, HS = 3, 5, 4, 2, 8

FACTS = (
    "is_cross_layer",
    "is_kv_list",
    "is_layer_list",
    "is_mla",
    "is_hnd",
    "is_fused_packed",
    "is_two_major",
    "is_pbs_fused",
    "is_kv_second_tuple",
    "is_single_kv",
)


def _t(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


def _layers(*shape: int) -> list[torch.Tensor]:
    return [_t(*shape) for _ in range(NL)]


# One normalised kv_caches per format whose geometry kv_geometry also reads.
BUILDERS = {
    F.NB_NL_TWO_BS_NH_HS: lambda: _t(NB, NL, 2, BS, NH, HS),
    F.NB_NL_TWO_NH_BS_HS: lambda: _t(NB, NL, 2, NH, BS, HS),
    F.NL_X_TWO_NB_BS_NH_HS: lambda: _layers(2, NB, BS, NH, HS),
    F.NL_X_NB_TWO_BS_NH_HS: lambda: _layers(NB, 2, BS, NH, HS),
    F.NL_X_TWO_NB_NH_BS_HS: lambda: _layers(2, NB, NH, BS, HS),
    F.NL_X_NB_TWO_NH_BS_HS: lambda: _layers(NB, 2, NH, BS, HS),
    F.NL_X_TWO_NB_NH_ONE_BS_HS: lambda: _layers(2, NB, NH, 1, BS, HS),
    F.NL_X_NB_BS_HS: lambda: _layers(NB, BS, HS),
    F.NL_X_NB_BSV_BSS: lambda: _layers(NB, BS, HS),
    F.TWO_X_NL_X_NB_BS_NH_HS: lambda: [_layers(NB, BS, NH, HS) for _ in range(2)],
    F.NL_X_NB_NH_BS_CS: lambda: _layers(NB, NH, BS, 2 * HS),
    F.NL_X_NB_BS_NH_CS: lambda: _layers(NB, BS, NH, 2 * HS),
    F.NL_X_NB_BS_NH_HS: lambda: _layers(NB, BS, NH, HS),
    F.NL_X_TWO_X_NB_BS_NH_HS: lambda: [(_t(NB, BS, NH, HS), _t(NB, BS, NH, HS)) for _ in range(NL)],
    F.NL_X_NP_X_NB_BS_ONE_HS: lambda: [
        (_t(NB, BS, 1, HS), _t(NB, BS, 1, HS // 2)) for _ in range(NL)
    ],
}


@pytest.mark.parametrize("rec", all_specs(), ids=lambda r: r.engine_kv_format.name)
def test_spec_class_facts_are_the_table_record(rec) -> None:
    cls = get_spec_class(rec.engine_kv_format)
    assert issubclass(cls, KVFormatSpec)
    assert cls.__name__ == f"{rec.engine_kv_format.name}_Spec"
    assert getattr(registry, cls.__name__) is cls
    assert cls.engine_kv_format is rec.engine_kv_format
    assert cls.attention_backends == rec.attention_backends
    for fact in FACTS:
        assert getattr(cls, fact) is getattr(rec, fact), (rec.engine_kv_format.name, fact)
    # Exactly one structural shape per format.
    assert cls.is_cross_layer + cls.is_kv_list + cls.is_layer_list == 1


def test_lookup_accepts_every_spelling_of_a_format() -> None:
    cls = get_spec_class(F.NL_X_NB_BS_HS)
    assert get_spec_class(int(F.NL_X_NB_BS_HS)) is cls
    assert get_spec_class(lmcache_native.EngineKVFormat.NL_X_NB_BS_HS) is cls
    with pytest.raises(ValueError, match="Unknown Engine KV Format"):
        get_spec_class(99)
    with pytest.raises(ValueError):
        describe_shape(99)


def test_interface_itself_cannot_wrap_a_cache() -> None:
    with pytest.raises(TypeError, match="get_spec_class"):
        KVFormatSpec(_layers(NB, BS, HS))


@pytest.mark.parametrize("fmt", list(BUILDERS), ids=lambda f: f.name)
def test_geometry_agrees_with_the_kernels_reading(fmt: F) -> None:
    """The spec's sizes are the ones kv_geometry hands the transfer kernels."""
    kv = BUILDERS[fmt]()
    spec = get_spec(kv, fmt)
    geom = geometry_from_tensors(kv, format_spec(fmt), 0, "kv_caches")
    assert spec.num_layers() == geom.num_layers == NL
    assert spec.num_blocks() == geom.num_blocks == NB
    assert spec.block_size() == geom.block_size == BS
    assert spec.num_heads() == geom.num_heads
    assert spec.head_size() == geom.head_width
    assert spec.kv_size() == geom.kv_size
    assert spec.dtype() == geom.dtype
    assert spec.page_buffer_size() == spec.tokens_per_layer() == NB * BS
    # An LMCache object row holds hidden_dim elements per plane.
    assert spec.hidden_dim() == geom.row_elems


def test_fused_page_axis_formats_refuse_block_geometry() -> None:
    kv = [_layers(NB * BS, NH, HS) for _ in range(2)]
    spec = get_spec(kv, F.TWO_X_NL_X_NBBS_NH_HS)
    assert spec.page_buffer_size() == NB * BS
    assert (spec.num_layers(), spec.num_heads(), spec.head_size()) == (NL, NH, HS)
    for getter in (spec.num_blocks, spec.block_size):
        with pytest.raises(ValueError, match="fused axis"):
            getter()


def test_per_layer_sizes_follow_layer_idx() -> None:
    # Mixed MLA pools: layers may differ in width and block size.
    kv = [_t(NB, BS, HS), _t(NB, 2 * BS, 3 * HS, dtype=torch.bfloat16)]
    spec = get_spec(kv, F.NL_X_NB_BS_HS)
    assert (spec.head_size(0), spec.head_size(1)) == (HS, 3 * HS)
    assert (spec.block_size(0), spec.block_size(1)) == (BS, 2 * BS)
    assert (spec.dtype(0), spec.dtype(1)) == (torch.float16, torch.bfloat16)
    assert spec.num_heads(1) == 1
    with pytest.raises(IndexError):
        spec.head_size(2)


def test_mixed_dtype_plane_tuple_counts_bytes_in_the_first_planes_dtype() -> None:
    # An int8 latent beside a float16 rope plane: 512 + 2 * 64 int8 columns.
    kv = [(_t(NB, BS, 1, 512, dtype=torch.int8), _t(NB, BS, 1, 64)) for _ in range(NL)]
    spec = get_spec(kv, F.NL_X_NP_X_NB_BS_ONE_HS)
    assert spec.head_size() == spec.hidden_dim() == 640
    assert spec.elements_per_layer() == NB * BS * (512 + 64)
    odd = [(_t(NB, BS, 1, 3), _t(NB, BS, 1, 1, dtype=torch.int8))]
    with pytest.raises(ValueError, match="whole number"):
        get_spec(odd, F.NL_X_NP_X_NB_BS_ONE_HS).head_size()


def test_data_ptrs_order() -> None:
    k, v = _layers(NB, BS, NH, HS), _layers(NB, BS, NH, HS)
    kv_list = get_spec([k, v], F.TWO_X_NL_X_NB_BS_NH_HS)
    assert kv_list.data_ptrs([2, 0]) == [
        k[2].data_ptr(),
        k[0].data_ptr(),
        v[2].data_ptr(),
        v[0].data_ptr(),
    ]
    # SGLang may also hand the K/V list over flat: [K_0..K_n-1, V_0..V_n-1].
    flat = get_spec([*k, *v], F.TWO_X_NL_X_NB_BS_NH_HS)
    assert flat.num_layers() == NL
    assert flat.data_ptrs([1]) == [k[1].data_ptr(), v[1].data_ptr()]

    pairs = list(zip(k, v))
    tuples = get_spec(pairs, F.NL_X_TWO_X_NB_BS_NH_HS)
    assert tuples.data_ptrs([1, 2]) == [
        k[1].data_ptr(),
        v[1].data_ptr(),
        k[2].data_ptr(),
        v[2].data_ptr(),
    ]
    assert tuples.kv_size() == 2 and tuples.elements_per_layer() == 2 * NB * BS * NH * HS

    cross = _t(NB, NL, 2, BS, NH, HS)
    assert get_spec(cross, F.NB_NL_TWO_BS_NH_HS).data_ptrs([0, 1]) == [cross.data_ptr()]

    layers = _layers(2, NB, BS, NH, HS)
    per_layer = get_spec(layers, F.NL_X_TWO_NB_BS_NH_HS)
    assert per_layer.data_ptrs([2]) == [layers[2].data_ptr()]


def test_paged_layer_shape_is_the_physical_tensor_shape() -> None:
    # RBLN keeps its singleton axis: the shape must match the tensor the engine allocates.
    cls = get_spec_class(F.NL_X_TWO_NB_NH_ONE_BS_HS)
    assert cls.paged_layer_shape(NB, BS, NH, HS) == (2, NB, NH, 1, BS, HS)
    assert tuple(BUILDERS[F.NL_X_TWO_NB_NH_ONE_BS_HS]()[0].shape) == (2, NB, NH, 1, BS, HS)
    assert get_spec_class(F.NL_X_NB_BSV_BSS).paged_layer_shape(NB, BS, NH, HS) == (NB, BS, HS)
    with pytest.raises(ValueError, match="one paged tensor per layer"):
        get_spec_class(F.NL_X_NP_X_NB_BS_ONE_HS).paged_layer_shape(NB, BS, NH, HS)


def test_shape_strings() -> None:
    assert describe_shape(F.NL_X_NB_BSV_BSS) == "NL x [NB, BSxVALS, BSxSCALES]"
    assert describe_shape(F.NL_X_NP_X_NB_BS_ONE_HS) == "NL x NP x [NB, BS, 1, HS]"
    kv = BUILDERS[F.NL_X_NB_BSV_BSS]()
    assert get_spec(kv, F.NL_X_NB_BSV_BSS).concrete_shape_str() == f"{NL} x [{NB}, {BS}, {BS}]"
    assert utils.get_concrete_engine_kv_shape(kv, F.NL_X_NB_BS_HS) == f"{NL} x [{NB}, {BS}, {HS}]"
    assert utils.get_engine_kv_shape_description(99) == "Unknown (99)"
    assert utils.get_attention_backend(99) == "Unknown (99)"
    assert utils.get_attention_backend(F.NL_X_NB_NH_BS_CS) == "fused-kv-hnd"


def test_deprecated_packed_tail_layouts_warn_and_keep_upstreams_counts() -> None:
    kv = _layers(NB, BS, NH, 2, HS)
    with pytest.warns(DeprecationWarning, match="NL_X_NB_BS_NH_CS"):
        spec = get_spec(kv, F.NL_X_NB_BS_NH_TWO_HS)
    assert (spec.head_size(), spec.hidden_dim(), spec.kv_size()) == (2 * HS, NH * HS, 1)
    assert spec.concrete_shape_str() == f"{NL} x [{NB}, {BS}, {NH}, 2, {HS}]"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        get_spec(_layers(NB, BS, NH, 2 * HS), F.NL_X_NB_BS_NH_CS)  # not deprecated


def test_utils_facade_and_helpers() -> None:
    kv = BUILDERS[F.NL_X_NB_TWO_NH_BS_HS]()
    fmt = F.NL_X_NB_TWO_NH_BS_HS
    assert utils.get_num_layers(kv, fmt) == NL
    assert utils.get_num_blocks(kv, fmt) == NB
    assert utils.get_block_size(kv, fmt) == BS
    assert utils.get_num_heads(kv, fmt) == NH
    assert utils.get_head_size(kv, fmt) == HS
    assert utils.get_hidden_dim_size(kv, fmt) == NH * HS
    assert utils.get_kv_size(kv, fmt) == 2
    assert utils.get_elements_per_layer(kv, fmt) == 2 * NB * NH * BS * HS
    assert utils.get_dtype(kv, fmt) == torch.float16
    assert utils.get_group_data_ptrs(kv, fmt, [0]) == [kv[0].data_ptr()]
    assert utils.get_device([[kv[0]]]) == torch.device("cpu")
    with pytest.raises(ValueError):
        utils.get_device([])
    hints: utils.LayoutHints = {"kv_layout": "HND", "tokens_per_block": BS}
    assert hints["kv_layout"] == "HND"
    assert extract_kv_cache_shapes([kv, (kv[0][0],)]) == {kv[0].shape, kv[0][0].shape}
