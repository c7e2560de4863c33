"""Cache contexts for LMCache-driven transfer, dispatched by the device a worker declares.

A worker registers its KV cache as ``DeviceIPCWrapper``s; each wrapper class names its
``device_type``.  :func:`resolve_lmcache_driven_device` finds that device's ``DeviceSpec``
in the registry and checks every capability the server's LMCache-driven path needs (IPC
wrapper, handle transfer, event IPC, a cache context); :func:`create_cache_context` builds
the context.  Nothing here names a device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lmcache.utils import EngineType
from lmcache.v1.platform.base.cache_context import BaseCacheContext
from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.registry import get_device_spec

if TYPE_CHECKING:
    from lmcache.v1.platform.base.event_ipc import EventIPCBackend
    from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper

DeviceSpecLookup = Callable[[str], DeviceSpec | None]


class LMCacheDrivenUnsupportedError(ValueError):
    """The declared device cannot take part in LMCache-driven transfer (and why)."""


@dataclasses.dataclass(frozen=True)
class LMCacheDrivenDevice:
    """A device that passed the LMCache-driven checks: its spec and its event backend."""

    device_type: str
    spec: DeviceSpec
    events: EventIPCBackend

    def create_cache_context(
        self, kv_caches: Sequence[DeviceIPCWrapper], *args: object, **kwargs: object
    ) -> BaseCacheContext:
        """``DeviceSpec.create_cache_context``; a spec without one is unsupported, not a bug."""
        try:
            return self.spec.create_cache_context(kv_caches, *args, **kwargs)
        except NotImplementedError as exc:
            raise LMCacheDrivenUnsupportedError(str(exc)) from None


def _wrapper_device_type(wrapper: DeviceIPCWrapper) -> str:
    device_type = getattr(type(wrapper), "device_type", "")
    if device_type:
        return str(device_type)
    return str(wrapper.to_tensor().device.type)


def declared_device_type(kv_caches: Sequence[DeviceIPCWrapper]) -> str:
    """The one device type the registered KV-cache wrappers declare (``ValueError`` if not)."""
    if not kv_caches:
        raise ValueError("a KV cache needs at least one wrapper")
    device_types = {_wrapper_device_type(w) for w in kv_caches}
    if len(device_types) != 1:
        raise ValueError(f"KV-cache wrappers span several device types: {sorted(device_types)}")
    (device_type,) = device_types
    return device_type


def _unsupported(device_type: str, backend: str, reason: str) -> LMCacheDrivenUnsupportedError:
    return LMCacheDrivenUnsupportedError(
        f"device type {device_type!r} (backend {backend!r}) cannot use the lmcache_driven "
        f"transfer mode in this server: {reason}. Use the engine_driven transfer mode "
        f"(LMCACHE_MP_TRANSFER_MODE=engine_driven)."
    )


def resolve_lmcache_driven_device(
    device_type: str, device_specs: DeviceSpecLookup = get_device_spec
) -> LMCacheDrivenDevice:
    """The registered spec of ``device_type`` and its event backend, or the reason it fails."""
    spec = device_specs(device_type)
    if spec is None:
        raise _unsupported(device_type, device_type, "no DeviceSpec is registered for it")
    name = spec.backend_name
    if not spec.is_available():
        raise _unsupported(device_type, name, "the backend is not available in this process")
    if spec.ipc_wrapper_cls is None:
        raise _unsupported(device_type, name, "DeviceSpec.ipc_wrapper_cls is None")
    if not spec.is_handle_transfer_available():
        raise _unsupported(
            device_type, name, "DeviceSpec.is_handle_transfer_available() returned False"
        )
    events = spec.event_ipc_backend
    if events is None:
        raise _unsupported(device_type, name, "DeviceSpec.event_ipc_backend is None")
    return LMCacheDrivenDevice(device_type, spec, events)


def check_event_support(device: LMCacheDrivenDevice, context: BaseCacheContext) -> None:
    """``EventIPCBackend.check_event_support`` for the context's device, as unsupported."""
    try:
        device.events.check_event_support(context.device)
    except RuntimeError as exc:
        raise _unsupported(device.device_type, device.spec.backend_name, str(exc)) from None


def create_cache_context(
    kv_caches: Sequence[Any],
    lmcache_tokens_per_chunk: int = 256,
    layout_hints: Mapping[str, Any] | None = None,
    engine_group_infos: Sequence[Any] = (),
    engine_type: EngineType = EngineType.VLLM,
    separate_object_groups: bool = False,
    full_sw_kv: bool = False,
) -> BaseCacheContext:
    """Dispatch to ``DeviceSpec.create_cache_context`` of the wrappers' device type.

    Upstream 0.5.6's signature; the seven arguments are forwarded positionally, as upstream
    does, so a plugin's context written against upstream receives them unchanged.
    """
    if not kv_caches:
        raise ValueError("create_cache_context requires a non-empty kv_caches list")
    try:
        device_type = declared_device_type(kv_caches)
    except ValueError as exc:
        raise ValueError(f"all KV-cache wrappers must share one device type: {exc}") from None
    spec = get_device_spec(device_type)
    if spec is None:
        raise ValueError(
            f"No cache-context class registered for device type {device_type!r}: no "
            f"DeviceSpec of lmcache-core or of an installed lmcache.device_plugins entry "
            f"point serves it (run `lmcache devices`; install the vendor plugin wheel)."
        )
    return spec.create_cache_context(
        kv_caches,
        lmcache_tokens_per_chunk,
        layout_hints,
        engine_group_infos,
        engine_type,
        separate_object_groups,
        full_sw_kv,
    )
