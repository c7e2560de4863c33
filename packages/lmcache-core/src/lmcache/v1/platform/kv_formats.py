"""The ``EngineKVFormat`` table: one declarative record per format, no torch views.

Each format is one :class:`KVFormatSpec`: how the engine hands over its buffers
(``container``), the axis names of one buffer (``dims``) and upstream's layout flags. Every
consumer (the torch baseline, :mod:`lmcache.v1.platform.kernel_kit` and vendor kernels)
reads layouts from here; nothing in this module imports torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "CANONICAL_AXES",
    "CONTAINERS",
    "EngineKVFormat",
    "KVFormatSpec",
    "all_specs",
    "format_spec",
]


class EngineKVFormat(enum.IntEnum):
    """Layout of the serving engine's paged KV cache (values are part of the ABI).

    ``NL x [...]`` is a Python list of per-layer tensors; see ``docs/ops.md`` for shapes.
    """

    NB_NL_TWO_BS_NH_HS = 0
    NL_X_TWO_NB_BS_NH_HS = 1
    NL_X_NB_TWO_BS_NH_HS = 2
    NL_X_NB_BS_HS = 3
    TWO_X_NL_X_NBBS_NH_HS = 4
    NL_X_NBBS_ONE_HS = 5
    NL_X_TWO_NB_NH_BS_HS = 6
    NL_X_NB_TWO_NH_BS_HS = 7
    NB_NL_TWO_NH_BS_HS = 8
    TWO_X_NL_X_NB_BS_NH_HS = 9
    NL_X_NB_NH_BS_TWO_HS = 10
    NL_X_NB_BS_NH_TWO_HS = 11
    NL_X_NB_NH_BS_CS = 12
    NL_X_NB_BS_NH_CS = 13
    NL_X_NB_BSV_BSS = 14
    NL_X_TWO_NB_NH_ONE_BS_HS = 15
    NL_X_TWO_X_NB_BS_NH_HS = 16
    NL_X_NP_X_NB_BS_ONE_HS = 17
    NL_X_NB_BS_NH_HS = 18


CANONICAL_AXES = ("KV", "NL", "NB", "BS", "NH", "HS")

# How the engine passes its buffers:
#   cross        one tensor holding every layer
#   layers       NL x tensor
#   kv_layers    2 x NL x tensor (a K list and a V list; flat [K_0..K_n-1, V_0..V_n-1] too)
#   layer_tuples NL x tuple of tensors (K/V pairs, or MLA planes concatenated along HS)
CONTAINERS = ("cross", "layers", "kv_layers", "layer_tuples")


@dataclass(frozen=True)
class KVFormatSpec:
    """One engine KV layout.

    ``dims`` names the axes of one engine tensor after its ``packed_tail`` trailing axes are
    merged into ``HS`` (fused K|V layouts store ``[.., 2, HS]`` per head). ``ONE`` marks an
    axis of size one; ``PBS`` a fused ``NB*BS`` axis.
    """

    engine_kv_format: EngineKVFormat
    container: str
    dims: tuple[str, ...]
    attention_backends: tuple[str, ...]
    packed_tail: int = 1
    tuple_axis: str = ""  # layer_tuples only: "KV" (K, V) pairs or "HS" (MLA planes)
    cross_layer: bool = False
    kv_list: bool = False
    layer_list: bool = False
    mla: bool = False
    hnd: bool = False
    fused_packed: bool = False
    two_major: bool = False
    pbs_fused: bool = False
    kv_second_tuple: bool = False
    single_kv: bool = False

    @property
    def kv_size(self) -> int:
        """Planes in the LMCache object: 1 for MLA, fused K|V and single-KV layouts."""
        return 1 if (self.mla or self.fused_packed or self.single_kv) else 2

    # Upstream's KVFormatSpec class-attribute names, for code written against them.
    @property
    def is_cross_layer(self) -> bool:
        return self.cross_layer

    @property
    def is_kv_list(self) -> bool:
        return self.kv_list

    @property
    def is_layer_list(self) -> bool:
        return self.layer_list

    @property
    def is_mla(self) -> bool:
        return self.mla

    @property
    def is_hnd(self) -> bool:
        return self.hnd

    @property
    def is_fused_packed(self) -> bool:
        return self.fused_packed

    @property
    def is_two_major(self) -> bool:
        return self.two_major

    @property
    def is_pbs_fused(self) -> bool:
        return self.pbs_fused

    @property
    def is_kv_second_tuple(self) -> bool:
        return self.kv_second_tuple

    @property
    def is_single_kv(self) -> bool:
        return self.single_kv


F = EngineKVFormat
_SPECS: tuple[KVFormatSpec, ...] = (
    KVFormatSpec(F.NB_NL_TWO_BS_NH_HS, "cross", ("NB", "NL", "KV", "BS", "NH", "HS"),
                 ("vllm-cross-layer",), cross_layer=True),
    KVFormatSpec(F.NL_X_TWO_NB_BS_NH_HS, "layers", ("KV", "NB", "BS", "NH", "HS"),
                 ("vllm-flash-attn",), layer_list=True, two_major=True),
    KVFormatSpec(F.NL_X_NB_TWO_BS_NH_HS, "layers", ("NB", "KV", "BS", "NH", "HS"),
                 ("vllm-flashinfer",), layer_list=True),
    KVFormatSpec(F.NL_X_NB_BS_HS, "layers", ("NB", "BS", "HS"),
                 ("vllm-mla", "sglang-mla-mp"), layer_list=True, mla=True),
    KVFormatSpec(F.TWO_X_NL_X_NBBS_NH_HS, "kv_layers", ("PBS", "NH", "HS"),
                 ("sglang-mha",), kv_list=True, pbs_fused=True),
    KVFormatSpec(F.NL_X_NBBS_ONE_HS, "layers", ("PBS", "ONE", "HS"),
                 ("sglang-mla",), layer_list=True, mla=True, pbs_fused=True),
    KVFormatSpec(F.NL_X_TWO_NB_NH_BS_HS, "layers", ("KV", "NB", "NH", "BS", "HS"),
                 ("flash-attn-hnd",), layer_list=True, hnd=True, two_major=True),
    KVFormatSpec(F.NL_X_NB_TWO_NH_BS_HS, "layers", ("NB", "KV", "NH", "BS", "HS"),
                 ("flashinfer-hnd",), layer_list=True, hnd=True),
    KVFormatSpec(F.NB_NL_TWO_NH_BS_HS, "cross", ("NB", "NL", "KV", "NH", "BS", "HS"),
                 ("trtllm-cross-layer-hnd",), cross_layer=True, hnd=True),
    KVFormatSpec(F.TWO_X_NL_X_NB_BS_NH_HS, "kv_layers", ("NB", "BS", "NH", "HS"),
                 ("sglang-mha-mp",), kv_list=True),
    KVFormatSpec(F.NL_X_NB_NH_BS_TWO_HS, "layers", ("NB", "NH", "BS", "HS"),
                 ("vllm-blocks-first-hnd",), packed_tail=2, layer_list=True, hnd=True,
                 fused_packed=True),
    KVFormatSpec(F.NL_X_NB_BS_NH_TWO_HS, "layers", ("NB", "BS", "NH", "HS"),
                 ("vllm-blocks-first-nhd",), packed_tail=2, layer_list=True,
                 fused_packed=True),
    KVFormatSpec(F.NL_X_NB_NH_BS_CS, "layers", ("NB", "NH", "BS", "HS"),
                 ("fused-kv-hnd", "vllm-cpu"), layer_list=True, hnd=True, fused_packed=True),
    KVFormatSpec(F.NL_X_NB_BS_NH_CS, "layers", ("NB", "BS", "NH", "HS"),
                 ("fused-kv-nhd",), layer_list=True, fused_packed=True),
    KVFormatSpec(F.NL_X_NB_BSV_BSS, "layers", ("NB", "BS", "HS"),
                 ("dsa-indexer",), layer_list=True, mla=True),
    KVFormatSpec(F.NL_X_TWO_NB_NH_ONE_BS_HS, "layers", ("KV", "NB", "NH", "ONE", "BS", "HS"),
                 ("vllm-rbln",), layer_list=True, hnd=True, two_major=True),
    KVFormatSpec(F.NL_X_TWO_X_NB_BS_NH_HS, "layer_tuples", ("NB", "BS", "NH", "HS"),
                 ("vllm-ascend",), tuple_axis="KV", layer_list=True, kv_second_tuple=True),
    KVFormatSpec(F.NL_X_NP_X_NB_BS_ONE_HS, "layer_tuples", ("NB", "BS", "ONE", "HS"),
                 ("mla-dsa-planes",), tuple_axis="HS", layer_list=True, mla=True,
                 kv_second_tuple=True),
    KVFormatSpec(F.NL_X_NB_BS_NH_HS, "layers", ("NB", "BS", "NH", "HS"),
                 ("sglang-components",), layer_list=True, single_kv=True),
)  # fmt: skip
del F

_SPEC_BY_VALUE: dict[int, KVFormatSpec] = {int(s.engine_kv_format): s for s in _SPECS}


def format_spec(fmt: int | EngineKVFormat) -> KVFormatSpec:
    """The spec of ``fmt``; ValueError for a value that is not an ``EngineKVFormat``."""
    try:
        return _SPEC_BY_VALUE[int(fmt)]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"unsupported engine_kv_format: {fmt!r}") from None


def all_specs() -> tuple[KVFormatSpec, ...]:
    """Every format record, in ``EngineKVFormat`` order."""
    return _SPECS
