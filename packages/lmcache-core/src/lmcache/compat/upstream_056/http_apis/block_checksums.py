"""KV block checksums: the computation behind upstream 0.5.6's ``POST /cache/checksums``.

Re-exported by :mod:`.cache_api`, where upstream keeps it.

Upstream's route gathers a request's KV blocks out of the engine's paged cache and answers
one MD5 digest per run of ``chunk_size`` blocks, so two deployments (or a run before and
after a change) can compare cache contents block by block. This module is the
route-independent part: :func:`compute_block_checksums` takes the per-layer KV tensors
and each layer's block axis, and :func:`block_axes_for_formats` derives those axes from
the layers' ``EngineKVFormat``. The HTTP route itself is not provided (lmcache-core's
server does not hold the engine's paged KV tensors); ``_compute_block_checksums`` (in
:mod:`.cache_api`) keeps upstream's private name.

Digests equal upstream's for the same input: a chunk's bytes are the C-contiguous block
slice of each layer, in layer order; ``bfloat16`` is hashed as its ``float32`` upcast
(upstream's choice, since numpy has no bfloat16). Dtypes numpy cannot hold at all (the
fp8 types) are hashed as their raw bytes.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import torch

from lmcache.v1.platform.kv_formats import EngineKVFormat, format_spec

logger = logging.getLogger(__name__)

__all__ = ["block_axes_for_formats", "block_axis_for_format", "compute_block_checksums"]


def block_axis_for_format(fmt: int | EngineKVFormat) -> int | None:
    """The ``NB`` (block) axis of one layer's tensor in ``fmt``, or None when the format
    has no per-layer tensor with a separate block axis (cross-layer buffers, K/V lists,
    tuples, fused ``NB*BS`` page buffers): block addressing does not map onto those."""
    spec = format_spec(fmt)
    if spec.container != "layers" or "NB" not in spec.dims:
        return None
    return spec.dims.index("NB")


def block_axes_for_formats(
    formats_per_layer: Sequence[int | EngineKVFormat | None],
) -> list[int]:
    """Each layer's block axis. A ``None`` layer (one that shares another layer's KV)
    takes the model's axis when every named format agrees on it.

    Raises:
        ValueError: a format has no block axis, or a ``None`` layer sits in a model
            whose layers disagree.
    """
    named: list[int] = []
    for fmt in formats_per_layer:
        if fmt is None:
            continue
        axis = block_axis_for_format(fmt)
        if axis is None:
            raise ValueError(f"checksums are not supported for KV format {fmt!r}")
        named.append(axis)
    shared = named[0] if named and all(a == named[0] for a in named) else None
    axes: list[int] = []
    it = iter(named)
    for fmt in formats_per_layer:
        if fmt is not None:
            axes.append(next(it))
        elif shared is not None:
            axes.append(shared)
        else:
            raise ValueError("a KV-sharing layer has no block axis in a mixed-format model")
    return axes


def _hashable(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU in a dtype ``Tensor.numpy`` accepts (see the module docstring)."""
    t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.float()
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.contiguous().view(torch.uint8)
    return t


def _digest_update(md5: Any, t: torch.Tensor) -> None:
    md5.update(t.contiguous().numpy().tobytes())


def compute_block_checksums(
    kv_tensors: Sequence[torch.Tensor],
    block_ids: Sequence[int],
    block_axes: Sequence[int],
    chunk_size: int,
    layerwise: bool,
) -> dict[str, Any]:
    """MD5 digests of the blocks ``block_ids`` (in that order), ``chunk_size`` blocks per
    digest; the last digest covers the remainder.

    ``kv_tensors[i]`` is layer ``i``'s KV tensor and ``block_axes[i]`` its block axis.
    With ``layerwise`` the answer holds one digest list per layer (``"layer_<i>"``);
    otherwise each chunk's digest covers that chunk of every layer, in layer order.

    Returns:
        ``{"status": "success", "chunk_size", "num_chunks", "chunk_checksums",
        "layerwise"}`` -- upstream's response body, less ``block_id_ranges``.

    Raises:
        ValueError: ``chunk_size`` is not positive or the axes do not match the layers.
        IndexError: a block axis is out of range for its tensor (from ``index_select``).
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if len(block_axes) != len(kv_tensors):
        raise ValueError(f"{len(block_axes)} block axes for {len(kv_tensors)} layers")
    n_blocks = len(block_ids)
    bounds = [(s, min(s + chunk_size, n_blocks)) for s in range(0, n_blocks, chunk_size)]

    # One gather and one device-to-host copy per layer; chunks are slices of it.
    index = torch.tensor(list(block_ids), dtype=torch.long)
    index_on: dict[torch.device, torch.Tensor] = {index.device: index}
    gathered: list[torch.Tensor] = []
    for kv, axis in zip(kv_tensors, block_axes, strict=True):
        idx = index_on.get(kv.device)
        if idx is None:
            idx = index_on[kv.device] = index.to(kv.device)
        gathered.append(_hashable(kv.index_select(axis, idx)))

    checksums: list[str] | dict[str, list[str]]
    if layerwise:
        per_layer: dict[str, list[str]] = {}
        for li, (blocks, axis) in enumerate(zip(gathered, block_axes, strict=True)):
            digests = []
            for s, e in bounds:
                md5 = hashlib.md5()
                _digest_update(md5, blocks.narrow(axis, s, e - s))
                digests.append(md5.hexdigest())
            per_layer[f"layer_{li}"] = digests
        checksums = per_layer
    else:
        combined: list[str] = []
        for s, e in bounds:
            md5 = hashlib.md5()
            for blocks, axis in zip(gathered, block_axes, strict=True):
                _digest_update(md5, blocks.narrow(axis, s, e - s))
            combined.append(md5.hexdigest())
        checksums = combined
    logger.debug("checksummed %d blocks of %d layers", n_blocks, len(gathered))
    return {
        "status": "success",
        "chunk_size": chunk_size,
        "num_chunks": len(bounds),
        "chunk_checksums": checksums,
        "layerwise": layerwise,
    }
