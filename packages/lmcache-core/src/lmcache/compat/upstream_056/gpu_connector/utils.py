"""Part of upstream LMCache 0.5.6's ``lmcache.v1.gpu_connector.utils``: the registration
types and the ``get_*`` geometry facade over :mod:`upstream_056.gpu_connector.kv_format`.

Each ``get_*(kv_caches, engine_kv_format, ...)`` builds a transient spec and asks it one
question; ``normalize_kv_and_discover_format`` and its per-layer variant name formats
through :func:`~upstream_056.gpu_connector.kv_format.detect_format`. Not provided from
upstream's module: the in-process connector checks (they take upstream's
``GPUConnectorInterface`` and ``LMCacheEngineConfig``, which lmcache-core does not ship).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence

import torch

from lmcache.compat.upstream_056.gpu_connector.kv_format import (
    concrete_shape,
    describe_shape,
    detect_format,
    extract_kv_cache_shapes,
    get_spec,
    get_spec_class,
)
from lmcache.compat.upstream_056.gpu_connector.kv_format.types import (
    DiscoverableKVCache,
    LayoutHints,
)
from lmcache.utils import EngineType
from lmcache.v1.platform.kv_formats import EngineKVFormat, format_spec
from lmcache.v1.platform.ops_types import PageBufferShapeDesc

__all__ = [
    "DiscoverableKVCache",
    "LayoutHints",
    "get_attention_backend",
    "get_block_size",
    "get_concrete_engine_kv_shape",
    "get_concrete_engine_kv_shape_from_shape_desc",
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
    "get_shape_and_dtype",
    "get_tokens_per_layer",
    "legible_print_engine_kv_format",
    "make_page_buffer_shape_desc",
    "normalize_and_discover_per_layer_formats",
    "normalize_kv_and_discover_format",
    "resolve_block_stride_and_log_layout",
]

logger = logging.getLogger(__name__)

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


def get_concrete_engine_kv_shape_from_shape_desc(
    shape_desc: PageBufferShapeDesc, engine_kv_format: Fmt
) -> str:
    """The format's shape with one kernel group's sizes from ``shape_desc``.

    Group-accurate where :func:`get_concrete_engine_kv_shape` is not: ``NL`` is the
    group's layer count, so each group of a hybrid model reports its own shape. A fused
    ``NB*BS`` axis (``PBS``) reads ``nb * bs``. Formats whose shape names a size the
    descriptor does not hold (``CS``, ``BSxVALS``, ...) give ``Unknown (<format>)``.
    """
    sizes = {
        "NL": shape_desc.nl,
        "NB": shape_desc.nb,
        "BS": shape_desc.bs,
        "NH": shape_desc.nh,
        "HS": shape_desc.hs,
        "PBS": shape_desc.nb * shape_desc.bs,
    }
    try:
        return concrete_shape(engine_kv_format, lambda label: sizes[label])
    except (KeyError, ValueError):
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


def legible_print_engine_kv_format(engine_kv_format: Fmt) -> None:
    """Log a format's shape and representative backend (a warning when unknown)."""
    shape = get_engine_kv_shape_description(engine_kv_format)
    if shape.startswith("Unknown"):
        logger.warning("Unknown Engine KV Format: %s", engine_kv_format)
        return
    logger.info("Engine KV Format: %s", shape)
    logger.info("Currently used by:\n  - %s", get_attention_backend(engine_kv_format))


def normalize_kv_and_discover_format(
    kv_caches: DiscoverableKVCache,
    serving_engine: EngineType,
    layout_hints: LayoutHints | None = None,
) -> tuple[EngineKVFormat, DiscoverableKVCache]:
    """:func:`~upstream_056.gpu_connector.kv_format.detect_format` under upstream's older name."""
    return detect_format(kv_caches, serving_engine, layout_hints)


def _structure_key(entry: object) -> Hashable:
    """Nested ``(shape, dtype)`` of one layer's entry: equal keys, same layout."""
    if isinstance(entry, (list, tuple)):
        return tuple(_structure_key(item) for item in entry)
    shape = getattr(entry, "shape", None)
    return None if shape is None else (tuple(shape), getattr(entry, "dtype", None))


def get_shape_and_dtype(
    kv_caches: DiscoverableKVCache, layer_indices: Sequence[int] | None = None
) -> list[Hashable]:
    """The nested ``(shape, dtype)`` of each selected layer entry (all when None)."""
    entries = list(kv_caches)  # type: ignore[arg-type]
    chosen = range(len(entries)) if layer_indices is None else layer_indices
    return [_structure_key(entries[i]) for i in chosen]


def normalize_and_discover_per_layer_formats(
    kv_caches: DiscoverableKVCache,
    layer_index_groups: Sequence[Sequence[int]],
    serving_engine: EngineType,
    layout_hints: LayoutHints | None = None,
) -> tuple[DiscoverableKVCache, list[EngineKVFormat]]:
    """The normalised cache and one format per layer, for models whose layers differ
    (a K+V main cache beside a key-only index cache, say).

    A uniform cache whose format is not a per-layer list (cross-layer, K/V lists) is
    detected whole. Otherwise layers are detected per engine group
    (``layer_index_groups``; empty = one group) and, inside a group, per distinct
    ``(shape, dtype)`` structure. A layer no group names keeps its tensor and gets some
    detected format (downstream skips it).
    """
    if len(extract_kv_cache_shapes(kv_caches)) == 1:
        fmt, normalized = detect_format(kv_caches, serving_engine, layout_hints)
        if not get_spec_class(fmt).is_layer_list:
            return normalized, [fmt] * get_num_layers(normalized, fmt)
    entries = list(kv_caches)  # type: ignore[arg-type]
    keys = get_shape_and_dtype(entries)
    found: dict[int, tuple[DiscoverableKVCache, EngineKVFormat]] = {}
    for group in layer_index_groups or [range(len(entries))]:
        by_structure: dict[Hashable, list[int]] = {}
        for layer in group:
            by_structure.setdefault(keys[layer], []).append(layer)
        for layers in by_structure.values():
            fmt, normalized = detect_format(
                [entries[i] for i in layers], serving_engine, layout_hints
            )
            normalized_layers = list(normalized)  # type: ignore[arg-type]
            for layer, view in zip(layers, normalized_layers):
                found[layer] = (view, fmt)
    if not found:
        raise ValueError("no layer of kv_caches is in any engine group")
    fallback = next(iter(found.values()))[1]
    return (
        [found[i][0] if i in found else entries[i] for i in range(len(entries))],
        [found[i][1] if i in found else fallback for i in range(len(entries))],
    )


# Formats whose per-layer tensor has the block axis first and whose kernels honour a
# padded block stride (DeepSeek-style compressor caches sharing a wider KV pool, vLLM's
# blocks-first BLHNC/BLNHC views whose stride(0) spans every layer of a block).
# NL_X_NB_TWO_BS_NH_HS also starts with NB, but no engine pads it and the padding's axis
# would be ambiguous, so padding there is refused like any non-block-axis format.
_BLOCK_AXIS_FORMATS = frozenset(
    {
        EngineKVFormat.NL_X_NB_BS_HS,
        EngineKVFormat.NL_X_NB_BSV_BSS,
        EngineKVFormat.NL_X_NP_X_NB_BS_ONE_HS,
        EngineKVFormat.NL_X_NB_NH_BS_CS,
        EngineKVFormat.NL_X_NB_BS_NH_CS,
        EngineKVFormat.NL_X_NB_BS_NH_HS,
    }
)


def _layout_probe(
    kv_caches: DiscoverableKVCache, engine_kv_format: Fmt, layer_idx: int
) -> torch.Tensor:
    """One engine tensor whose shape and strides stand for ``layer_idx``'s layout."""
    spec = format_spec(engine_kv_format)
    if spec.cross_layer:
        if not isinstance(kv_caches, torch.Tensor):
            raise TypeError(
                "a cross-layer EngineKVFormat expects one backing torch.Tensor, "
                f"got {type(kv_caches).__name__}"
            )
        return kv_caches
    entry: object
    if spec.kv_list:
        entry = kv_caches[0][layer_idx]  # type: ignore[index]
    elif spec.kv_second_tuple or spec.container == "layer_tuples":
        entry = kv_caches[layer_idx][0]  # type: ignore[index]
    else:
        entry = kv_caches[layer_idx]  # type: ignore[index]
    if not isinstance(entry, torch.Tensor):
        raise TypeError(f"layer {layer_idx} of kv_caches is a {type(entry).__name__}, not a tensor")
    return entry


def _dim0_padding(tensor: torch.Tensor) -> int:
    """Elements between consecutive dim-0 slices beyond the tightly packed step."""
    if tensor.ndim < 2:
        return 0
    tight = 1
    for size in tensor.shape[1:]:
        tight *= int(size)
    return int(tensor.stride(0)) - tight


def resolve_block_stride_and_log_layout(
    kv_caches: DiscoverableKVCache, engine_kv_format: Fmt, layer_idx: int, group_idx: int
) -> int | None:
    """The per-block stride (elements) for a group's ``PageBufferShapeDesc``; logs the layout.

    For block-axis formats the probe tensor's ``stride(0)`` is returned as is (larger than
    the tight step when blocks are padded or interleaved). Other formats return None (the
    kernels derive the tight stride) and a padded dim 0 raises ``ValueError``, since no
    kernel could honour it and every block after the first would be read from the wrong
    bytes.
    """
    probe = _layout_probe(kv_caches, engine_kv_format, layer_idx)
    padding = _dim0_padding(probe)
    block_stride: int | None = None
    if engine_kv_format in _BLOCK_AXIS_FORMATS and probe.ndim > 0:
        block_stride = int(probe.stride(0))
    elif padding > 0:
        raise ValueError(
            f"group {group_idx}: layer {layer_idx}'s tensor has dim-0 padding ({padding} "
            f"elements per slice) but {EngineKVFormat(engine_kv_format).name} is not a "
            "block-axis format whose kernels honour a padded stride; shape="
            f"{tuple(probe.shape)}, stride={tuple(probe.stride())}, dtype={probe.dtype}"
        )
    logger.info(
        "Group %d first-layer tensor: layer_idx=%d shape=%s stride=%s is_contiguous=%s "
        "dtype=%s device=%s storage_offset=%d numel=%d padding_per_block=%d",
        group_idx,
        layer_idx,
        tuple(probe.shape),
        tuple(probe.stride()),
        probe.is_contiguous(),
        probe.dtype,
        probe.device,
        probe.storage_offset(),
        probe.numel(),
        padding,
    )
    return block_stride


def make_page_buffer_shape_desc(
    kv_caches: DiscoverableKVCache,
    engine_kv_format: Fmt,
    layer_idx: int,
    num_layers_in_group: int,
    num_blocks: int,
    block_size: int,
    block_stride_elems: int | None = None,
) -> PageBufferShapeDesc:
    """The kernels' ``PageBufferShapeDesc`` for one group, sized from ``layer_idx``.

    ``block_stride_elems`` (from :func:`resolve_block_stride_and_log_layout`) must be
    passed whenever the group's pool may be padded; None or 0 lets the kernels use the
    tight stride.
    """
    spec = get_spec(kv_caches, engine_kv_format)
    dtype = spec.dtype(layer_idx)
    return PageBufferShapeDesc(
        kv_size=spec.kv_size(),
        nl=num_layers_in_group,
        nb=num_blocks,
        bs=block_size,
        nh=1 if spec.is_mla else spec.num_heads(layer_idx),
        hs=spec.head_size(layer_idx),
        element_size=dtype.itemsize,
        block_stride_elems=int(block_stride_elems) if block_stride_elems else 0,
        dtype=dtype,
    )
