"""Wrap a worker's KV-cache tensors for the LMCache-driven transfer mode."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lmcache.v1.platform import resolve_kv_wrapper_factory

logger = logging.getLogger(__name__)

KVCache = list[Any]


def wrap_one_kv_cache(tensor: torch.Tensor) -> Any:
    """The device's ``DeviceIPCWrapper`` for ``tensor`` (via ``ipc_wrapper_cls.wrap``)."""
    return resolve_kv_wrapper_factory(tensor.device.type)(tensor)


def wrap_kv_caches(kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor]) -> KVCache:
    """One wrapper per layer, in layer order; partial wrappers are closed on failure."""
    tensors = list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)
    wrappers: KVCache = []
    try:
        for tensor in tensors:
            wrappers.append(wrap_one_kv_cache(tensor))
    except BaseException:
        for wrapper in wrappers:
            try:
                wrapper.close()
            except Exception:
                logger.debug("closing a partial KV wrapper failed", exc_info=True)
        raise
    return wrappers
