"""Part of upstream LMCache 0.5.6's ``lmcache.v1.gpu_connector.utils``: the registration
types and the ``get_*`` geometry facade over :mod:`lmcache.v1.gpu_connector.kv_format`.

Each ``get_*(kv_caches, engine_kv_format, ...)`` builds a transient spec and asks it one
question. Not provided from upstream's module: format discovery
(``normalize_kv_and_discover_format`` and the per-layer variant), the in-process
connector checks and the page-buffer shape-descriptor builders.
"""

from __future__ import annotations

import torch

from lmcache.v1.gpu_connector.kv_format import describe_shape, get_spec, get_spec_class
from lmcache.v1.gpu_connector.kv_format.types import DiscoverableKVCache, LayoutHints
from lmcache.v1.platform.kv_formats import EngineKVFormat

__all__ = [
    "DiscoverableKVCache",
    "LayoutHints",
    "get_attention_backend",
    "get_block_size",
    "get_concrete_engine_kv_shape",
    "get_device",
    "get_dtype",
    "get_elements_per_layer",
    "get_engine_kv_shape_description",
    "get_group_data_ptrs",
    "get_head_size",
    "get_hidden_dim_size",
    "get_kv_size",
    "get_num_blocks",
    "get_num_heads",
    "get_num_layers",
    "get_page_buffer_size",
    "get_tokens_per_layer",
]

Fmt = int | EngineKVFormat


def get_engine_kv_shape_description(engine_kv_format: Fmt) -> str:
    """The symbolic shape of a format (``NL x [2, NB, BS, NH, HS]``), or ``Unknown (...)``."""
    try:
        return describe_shape(engine_kv_format)
    except (KeyError, ValueError):
        return f"Unknown ({engine_kv_format})"


def get_attention_backend(engine_kv_format: Fmt) -> str:
    """A representative attention-backend label of the format (diagnostics only)."""
    try:
        backends = get_spec_class(engine_kv_format).attention_backends
    except ValueError:
        backends = ()
    return backends[0] if backends else f"Unknown ({engine_kv_format})"


def get_concrete_engine_kv_shape(kv_caches: DiscoverableKVCache, engine_kv_format: Fmt) -> str:
    """The format's shape with this cache's sizes (``80 x [2, 2048, 16, 8, 128]``)."""
    try:
        return get_spec(kv_caches, engine_kv_format).concrete_shape_str()
    except ValueError:
        return f"Unknown ({engine_kv_format})"


def get_num_layers(kv_caches: DiscoverableKVCache, engine_kv_format: Fmt) -> int:
    return get_spec(kv_caches, engine_kv_format).num_layers()


def get_num_blocks(kv_caches: DiscoverableKVCache, engine_kv_format: Fmt) -> int:
    """Blocks of the cache; ValueError for formats with a fused ``NB*BS`` axis."""
    return get_spec(kv_caches, engine_kv_format).num_blocks()


def get_block_size(
    kv_caches: DiscoverableKVCache, engine_kv_format: Fmt, layer_idx: int = 0
) -> int:
    """Tokens per block of ``layer_idx``; ValueError for a fused ``NB*BS`` axis."""
    return get_spec(kv_caches, engine_kv_format).block_size(layer_idx)


def get_page_buffer_size(kv_caches: DiscoverableKVCache, engine_kv_format: Fmt) -> int:
    return get_spec(kv_caches, engine_kv_format).page_buffer_size()


def get_kv_size(kv_caches: DiscoverableKVCache, engine_kv_format: Fmt) -> int:
    return get_spec(kv_caches, engine_kv_format).kv_size()


def get_num_heads(kv_caches: DiscoverableKVCache, engine_kv_format: Fmt, layer_idx: int = 0) -> int:
    return get_spec(kv_caches, engine_kv_format).num_heads(layer_idx)


def get_hidden_dim_size(
    kv_caches: DiscoverableKVCache, engine_kv_format: Fmt, layer_idx: int = 0
) -> int:
    return get_spec(kv_caches, engine_kv_format).hidden_dim(layer_idx)


def get_head_size(kv_caches: DiscoverableKVCache, engine_kv_format: Fmt, layer_idx: int = 0) -> int:
    return get_spec(kv_caches, engine_kv_format).head_size(layer_idx)


def get_tokens_per_layer(kv_caches: DiscoverableKVCache, engine_kv_format: Fmt) -> int:
    return get_spec(kv_caches, engine_kv_format).tokens_per_layer()


def get_elements_per_layer(kv_caches: DiscoverableKVCache, engine_kv_format: Fmt) -> int:
    return get_spec(kv_caches, engine_kv_format).elements_per_layer()


def get_dtype(
    kv_caches: DiscoverableKVCache, engine_kv_format: Fmt, layer_idx: int = 0
) -> torch.dtype:
    return get_spec(kv_caches, engine_kv_format).dtype(layer_idx)


def get_group_data_ptrs(
    kv_caches: DiscoverableKVCache, engine_kv_format: Fmt, layer_indices: list[int]
) -> list[int]:
    """Device addresses of ``layer_indices`` in kernel order (see ``KVFormatSpec.data_ptrs``)."""
    return get_spec(kv_caches, engine_kv_format).data_ptrs(layer_indices)


def get_device(kv_caches: DiscoverableKVCache) -> torch.device:
    """The device of the first tensor in ``kv_caches`` (all share one)."""
    probe: object = kv_caches
    while isinstance(probe, (list, tuple)):
        if not probe:
            raise ValueError("kv_caches holds no tensor")
        probe = probe[0]
    if not isinstance(probe, torch.Tensor):
        raise TypeError(f"kv_caches holds a {type(probe).__name__}, not a tensor")
    return probe.device
