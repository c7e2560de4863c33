"""ops_types: enum values, predicates, descriptors and the native-only plan stubs."""

from __future__ import annotations

import dataclasses

import pytest

from lmcache.v1.platform import ops_types
from lmcache.v1.platform.ops_types import (
    BatchStep,
    EngineKVFormat,
    GPUKVFormat,
    KernelGroupSpec,
    LaunchVar,
    PageBufferShapeDesc,
    StagingCopy,
    TransferDirection,
    TransferPhase,
)

FORMAT_VALUES = {
    "NB_NL_TWO_BS_NH_HS": 0, "NL_X_TWO_NB_BS_NH_HS": 1, "NL_X_NB_TWO_BS_NH_HS": 2,
    "NL_X_NB_BS_HS": 3, "TWO_X_NL_X_NBBS_NH_HS": 4, "NL_X_NBBS_ONE_HS": 5,
    "NL_X_TWO_NB_NH_BS_HS": 6, "NL_X_NB_TWO_NH_BS_HS": 7, "NB_NL_TWO_NH_BS_HS": 8,
    "TWO_X_NL_X_NB_BS_NH_HS": 9, "NL_X_NB_NH_BS_TWO_HS": 10, "NL_X_NB_BS_NH_TWO_HS": 11,
    "NL_X_NB_NH_BS_CS": 12, "NL_X_NB_BS_NH_CS": 13, "NL_X_NB_BSV_BSS": 14,
    "NL_X_TWO_NB_NH_ONE_BS_HS": 15, "NL_X_TWO_X_NB_BS_NH_HS": 16, "NL_X_NP_X_NB_BS_ONE_HS": 17,
    "NL_X_NB_BS_NH_HS": 18,
}  # fmt: skip


def test_enum_values() -> None:
    assert {m.name: m.value for m in EngineKVFormat} == FORMAT_VALUES
    assert GPUKVFormat is EngineKVFormat
    assert (TransferDirection.H2D, TransferDirection.D2H) == (0, 1)
    assert (TransferPhase.KERNEL, TransferPhase.STAGING) == (0, 1)


# Facts §1.1 flag column: format -> flags that are set.
FLAGS = {
    0: {"cross_layer"}, 1: {"layer_list", "two_major"}, 2: {"layer_list"},
    3: {"layer_list", "mla"}, 4: {"kv_list", "pbs_fused"}, 5: {"layer_list", "mla", "pbs_fused"},
    6: {"layer_list", "hnd", "two_major"}, 7: {"layer_list", "hnd"}, 8: {"cross_layer", "hnd"},
    9: {"kv_list"}, 10: {"layer_list", "hnd", "fused_packed"},
    11: {"layer_list", "fused_packed"}, 12: {"layer_list", "hnd", "fused_packed"},
    13: {"layer_list", "fused_packed"}, 14: {"layer_list", "mla"},
    15: {"layer_list", "hnd", "two_major"}, 16: {"layer_list", "kv_second_tuple"},
    17: {"layer_list", "mla", "kv_second_tuple"}, 18: {"layer_list", "single_kv"},
}  # fmt: skip
ALL_FLAGS = ["cross_layer", "kv_list", "layer_list", "mla", "hnd", "fused_packed", "two_major",
             "pbs_fused", "kv_second_tuple", "single_kv"]  # fmt: skip


@pytest.mark.parametrize("fmt", list(EngineKVFormat), ids=lambda f: f.name)
def test_spec_flags_and_predicates(fmt: EngineKVFormat) -> None:
    from lmcache.v1.platform.torch_ops import _format_spec

    spec = _format_spec(fmt)
    assert {f for f in ALL_FLAGS if getattr(spec, f)} == FLAGS[fmt]
    assert spec.is_hnd == ("hnd" in FLAGS[fmt])
    for predicate in ("is_kv_list", "is_layer_list", "is_cross_layer", "is_mla",
                      "is_kv_second_tuple"):  # fmt: skip
        assert getattr(ops_types, predicate)(fmt) == (predicate[3:] in FLAGS[fmt])


def test_unknown_format_is_a_value_error() -> None:
    from lmcache.v1.platform.torch_ops import _format_spec

    with pytest.raises(ValueError):
        _format_spec(19)
    with pytest.raises(ValueError):
        ops_types.is_mla(-1)


def test_page_buffer_shape_desc() -> None:
    desc = PageBufferShapeDesc()
    desc.kv_size, desc.nl, desc.nb, desc.bs, desc.nh, desc.hs = 2, 32, 100, 16, 8, 128
    desc.element_size, desc.block_stride_elems, desc.dtype = 2, 0, None
    assert desc == PageBufferShapeDesc(kv_size=2, nl=32, nb=100, bs=16, nh=8, hs=128,
                                       element_size=2)  # fmt: skip
    assert "nl=32" in repr(desc)
    with pytest.raises(AttributeError):
        desc.bogus = 1  # type: ignore[attr-defined]


def test_kernel_group_spec_ctor() -> None:
    desc = PageBufferShapeDesc(bs=16)
    spec = KernelGroupSpec(0x1000, [0x2000, 0x3000], desc, 256, 1, 0, 64)
    assert [f.name for f in dataclasses.fields(spec)] == [
        "paged_buffer_ptrs", "lmcache_objects_ptrs", "shape_desc", "lmcache_chunk_size",
        "engine_kv_format", "block_ids_base", "block_ids_capacity",
    ]  # fmt: skip
    assert spec.lmcache_objects_ptrs == [0x2000, 0x3000]


@pytest.mark.parametrize("cls", [StagingCopy, LaunchVar, BatchStep])
def test_plan_types_need_a_native_module(cls: type) -> None:
    with pytest.raises(NotImplementedError) as info:
        cls(1, 2, 3, 4)
    assert str(info.value) == (
        f"{cls.__name__} requires a backend-specific native module; "
        "no generic pure-Python fallback exists."
    )
