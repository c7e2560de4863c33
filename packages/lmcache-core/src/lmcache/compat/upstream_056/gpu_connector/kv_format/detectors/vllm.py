"""vLLM's KV-cache layouts (upstream 0.5.6's ``detectors.vllm``).

The per-layer rank and the K/V axis position tell vLLM's layouts apart; whether heads
come before block slots cannot be seen in a shape, so the registration's ``kv_layout``
hint decides (registrations without one meant HND on the CPU backend, NHD elsewhere).
"""

from __future__ import annotations

import torch

from lmcache.compat.upstream_056.gpu_connector.kv_format.detectors.base import (
    EngineDetector,
    measure_list_depth_until_tensor,
)
from lmcache.compat.upstream_056.gpu_connector.kv_format.types import (
    KV_LAYOUT_NAMES,
    DiscoverableKVCache,
    LayoutHints,
)
from lmcache.utils import EngineType
from lmcache.v1.platform.kv_formats import EngineKVFormat

__all__ = ["VLLM_Detector", "resolve_vllm_kv_layout"]

# The device type the engine's cache lives on; None = the selected platform's. A module
# attribute (upstream's name) so tests can pose as another host.
torch_device_type: str | None = None

# The DSA indexer row: 128 fp8 values and one fp32 scale, stored as bytes.
_INDEXER_ROW_BYTES = 132


def _host_device_type() -> str:
    if torch_device_type is not None:
        return torch_device_type
    from lmcache.v1.platform import get_torch_device

    return get_torch_device()[1]


def resolve_vllm_kv_layout(layout_hints: LayoutHints, cpu_attention_backend: bool) -> str:
    """The declared ``kv_layout``, or the pre-hint default (HND on CPU, NHD elsewhere).

    Raises:
        ValueError: the hint names a layout that is not one of ``KV_LAYOUT_NAMES``.
    """
    kv_layout = layout_hints.get("kv_layout")
    if kv_layout is None:
        return "HND" if cpu_attention_backend else "NHD"
    if kv_layout not in KV_LAYOUT_NAMES:
        raise ValueError(
            f"kv_layout hint {kv_layout!r} is not supported; expected one of "
            f"{', '.join(KV_LAYOUT_NAMES)}"
        )
    return kv_layout


def _is_indexer_plane(t: torch.Tensor) -> bool:
    return t.dtype == torch.uint8 and int(t.shape[-1]) == _INDEXER_ROW_BYTES


class VLLM_Detector(EngineDetector):
    engine_type = EngineType.VLLM

    def discover(
        self, kv_caches: DiscoverableKVCache, layout_hints: LayoutHints
    ) -> tuple[EngineKVFormat | None, DiscoverableKVCache]:
        cpu = _host_device_type() == "cpu"
        hnd = resolve_vllm_kv_layout(layout_hints, cpu) in ("HND", "BLHNC")
        depth, ndim, first = measure_list_depth_until_tensor(kv_caches)
        if depth == 0:
            return EngineKVFormat.NB_NL_TWO_BS_NH_HS, kv_caches
        layers = list(kv_caches)  # type: ignore[arg-type]
        if depth == 1 and ndim == 6 and first.shape[0] == 2 and first.shape[3] == 1:
            # vLLM-RBLN: always HND, with a unit axis its attention backend needs.
            return EngineKVFormat.NL_X_TWO_NB_NH_ONE_BS_HS, layers
        if depth == 2 and ndim == 4:
            return self._plane_tuples(layers)
        if depth == 1 and ndim == 3:
            if _is_indexer_plane(first):
                return EngineKVFormat.NL_X_NB_BSV_BSS, layers
            return EngineKVFormat.NL_X_NB_BS_HS, layers
        if depth != 1 or ndim not in (4, 5):
            return None, kv_caches
        if ndim == 4:
            # Rank 4 is only ever K|V packed per head ([NB, NH|BS, BS|NH, 2*HS]), kept raw;
            # a 5-D split would confuse NH == 2 with the K/V axis.
            head_axis = 1 if hnd else 2
            if first.shape[head_axis] == 1 and _is_indexer_plane(first):
                # Newer vLLM allocates the DSA indexer with a unit head axis.
                return EngineKVFormat.NL_X_NB_BSV_BSS, [t.squeeze(head_axis) for t in layers]
            if hnd:
                return EngineKVFormat.NL_X_NB_NH_BS_CS, layers
            return EngineKVFormat.NL_X_NB_BS_NH_CS, layers
        if first.shape[0] == 2:
            fmt = (
                EngineKVFormat.NL_X_TWO_NB_NH_BS_HS if hnd else EngineKVFormat.NL_X_TWO_NB_BS_NH_HS
            )
            return fmt, layers
        if first.shape[1] == 2:
            fmt = (
                EngineKVFormat.NL_X_NB_TWO_NH_BS_HS if hnd else EngineKVFormat.NL_X_NB_TWO_BS_NH_HS
            )
            return fmt, layers
        return None, kv_caches

    @staticmethod
    def _plane_tuples(
        layers: list[DiscoverableKVCache],
    ) -> tuple[EngineKVFormat | None, DiscoverableKVCache]:
        """vLLM-Ascend's per-layer tuples: (K, V) pairs, or MLA/DSA planes.

        Single-head planes that come one or three to a layer, or differ in width, are MLA
        planes; an equal-width pair reads as (K, V).
        """
        planes = list(layers[0])  # type: ignore[arg-type]
        one_head = all(int(p.shape[2]) == 1 for p in planes)
        widths = {int(p.shape[-1]) for p in planes}
        if one_head and (len(planes) in (1, 3) or len(widths) > 1):
            return EngineKVFormat.NL_X_NP_X_NB_BS_ONE_HS, layers
        if len(planes) == 2:
            return EngineKVFormat.NL_X_TWO_X_NB_BS_NH_HS, layers
        return None, layers
