"""Wrap a worker's KV-cache tensors for the LMCache-driven transfer mode."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch

from lmcache.v1.platform import resolve_kv_wrapper_factory
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper

logger = logging.getLogger(__name__)

KVCache = list[DeviceIPCWrapper]


def wrap_one_kv_cache(tensor: torch.Tensor, device_type: str | None = None) -> DeviceIPCWrapper:
    """The device's ``DeviceIPCWrapper`` for ``tensor`` (via ``ipc_wrapper_cls.wrap``).

    ``device_type`` names the serving backend's device type when it is not the tensor's own
    (see :func:`lmcache.v1.platform.serving_device_type`).
    """
    return resolve_kv_wrapper_factory(device_type or tensor.device.type)(tensor)


def wrap_kv_caches(
    kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor], device_type: str | None = None
) -> KVCache:
    """One wrapper per layer, in layer order; partial wrappers are closed on failure."""
    tensors = list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)
    wrappers: KVCache = []
    try:
        for tensor in tensors:
            wrappers.append(wrap_one_kv_cache(tensor, device_type))
    except BaseException:
        for wrapper in wrappers:
            try:
                wrapper.close()
            except Exception:
                logger.debug("closing a partial KV wrapper failed", exc_info=True)
        raise
    return wrappers
