"""Wrap a worker's KV-cache tensors for the LMCache-driven transfer mode."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch

from lmcache.v1.platform import resolve_kv_wrapper_factory
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper

logger = logging.getLogger(__name__)

KVCache = list[DeviceIPCWrapper]


KVPlanes = torch.Tensor | Sequence[torch.Tensor]


def _dispatch_device_type(value: KVPlanes) -> str:
    """The device type a layer's KV value is wrapped for: a tensor's own, or for a
    sequence of planes (e.g. ``(K, V)``) its first plane's; planes must share a device."""
    if isinstance(value, torch.Tensor):
        return value.device.type
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(
            f"a KV cache layer must be a tensor or a sequence of tensors, got "
            f"{type(value).__name__}"
        )
    if not value:
        raise ValueError("a KV cache layer given as a sequence of planes has no planes")
    devices = set()
    for plane in value:
        if not isinstance(plane, torch.Tensor):
            raise TypeError(f"a KV cache plane must be a tensor, got {type(plane).__name__}")
        devices.add(plane.device.type)
    if len(devices) > 1:
        raise ValueError(f"the planes of one KV cache layer are on different devices: {devices}")
    return value[0].device.type


def wrap_one_kv_cache(value: KVPlanes, device_type: str | None = None) -> DeviceIPCWrapper:
    """The device's ``DeviceIPCWrapper`` for one layer (via ``ipc_wrapper_cls.wrap``).

    ``value`` is the layer's tensor or its sequence of planes, handed to the device's
    factory whole (upstream 0.5.6 semantics).  ``device_type`` names the serving backend's
    device type when it is not the value's own (see
    :func:`lmcache.v1.platform.serving_device_type`).
    """
    return resolve_kv_wrapper_factory(device_type or _dispatch_device_type(value))(value)


def _release_partial_kv_wrappers(wrappers: Sequence[DeviceIPCWrapper]) -> None:
    """Close the wrappers made before a later layer failed, so no shared segment leaks."""
    for wrapper in wrappers:
        close = getattr(wrapper, "close", None)
        if close is None:
            continue
        try:
            close()
        except Exception:
            logger.debug("closing a partial KV wrapper failed", exc_info=True)


def wrap_kv_caches(
    kv_caches: Mapping[str, KVPlanes] | Sequence[KVPlanes], device_type: str | None = None
) -> KVCache:
    """One wrapper per layer, in layer order (a layer's plane tuple is not flattened);
    partial wrappers are released on failure."""
    layers = list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)
    wrappers: KVCache = []
    try:
        for layer in layers:
            # Upstream's signature is wrap_one_kv_cache(value): pass device_type only when set.
            if device_type is None:
                wrappers.append(wrap_one_kv_cache(layer))
            else:
                wrappers.append(wrap_one_kv_cache(layer, device_type))
    except BaseException:
        _release_partial_kv_wrappers(wrappers)
        raise
    return wrappers
