"""``create_cache_context``: build the cache context of a registered KV cache's device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmcache.v1.platform._device_detect import get_device_spec
from lmcache.v1.platform.base.cache_context import BaseCacheContext


def _wrapper_device_type(wrapper: Any) -> str:
    device_type = getattr(type(wrapper), "device_type", "")
    if device_type:
        return str(device_type)
    return str(wrapper.to_tensor().device.type)


def create_cache_context(kv_caches: Sequence[Any], *args: Any, **kwargs: Any) -> BaseCacheContext:
    """Dispatch to ``DeviceSpec.create_cache_context`` of the wrappers' device type."""
    if not kv_caches:
        raise ValueError("create_cache_context needs a non-empty list of KV-cache wrappers")
    device_types = {_wrapper_device_type(w) for w in kv_caches}
    if len(device_types) != 1:
        raise ValueError(f"KV-cache wrappers span several device types: {sorted(device_types)}")
    (device_type,) = device_types
    spec = get_device_spec(device_type)
    if spec is None:
        raise ValueError(f"No DeviceSpec registered for device type {device_type!r}")
    return spec.create_cache_context(kv_caches, *args, **kwargs)
