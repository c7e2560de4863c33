"""``DeviceSpec``: what a device backend declares to the LMCache platform registry.

A spec is cheap to construct (the registry instantiates every discovered spec once per
process) and keeps everything heavy (ops, native libraries, IPC wrappers, cache contexts)
behind lazy properties, as the plugin guide requires.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from lmcache.v1.platform.transfer_mode import MPTransferMode

if TYPE_CHECKING:
    from lmcache.v1.platform.base.cache_context import BaseCacheContext
    from lmcache.v1.platform.base.device_ops import DeviceOps
    from lmcache.v1.platform.base.event_ipc import EventIPCBackend
    from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
    from lmcache.v1.platform.base.pin_memory import PinMemoryBackend
    from lmcache.v1.platform.base.streams import (
        DeviceLike,
        DeviceStream,
        StreamEvent,
        TorchDeviceModule,
    )

logger = logging.getLogger(__name__)


class DeviceSpec:
    """Description of one concrete device backend.

    Subclasses override ``device_type``, ``backend_name`` (when several backends share a
    device type), ``torch_module_name`` and ``is_available``; the rest has working defaults.
    Instantiating ``DeviceSpec`` itself gives the no-capability fallback spec.
    """

    def __init__(self) -> None:
        # Per-instance caches: the registry keeps one instance per backend per process, so
        # these are the process-wide singletons the guide talks about.
        self._ops_cache: DeviceOps | None = None
        self._ops_lock = threading.Lock()
        self._pin_backend_cache: PinMemoryBackend | None = None

    # -- identity ---------------------------------------------------------------------
    @property
    def device_type(self) -> str:
        """Torch-facing device category, e.g. ``"cuda"``; several backends may share it."""
        return ""

    @property
    def backend_name(self) -> str:
        """Unique, lowercase selector of this concrete backend (``LMCACHE_DEVICE_BACKEND``)."""
        return self.device_type

    @property
    def torch_module_name(self) -> str:
        """Attribute of the ``torch`` package for this device, e.g. ``"cuda"``."""
        return ""

    @property
    def priority(self) -> int:
        """Preference among several *available* backends of one device type (higher wins).

        An lmcache extension over upstream: it lets an installed vendor wheel take over a
        device type from the in-tree baseline without any environment variable.
        """
        return 0

    def is_available(self) -> bool:
        """True when the device is usable. Must not import ``lmcache`` (import torch directly)."""
        return False

    # -- ops ----------------------------------------------------------------------------
    @property
    def ops_cls(self) -> type[DeviceOps]:
        """The ``DeviceOps`` subclass of this backend; the base is the pure torch baseline."""
        from lmcache.v1.platform.base.device_ops import DeviceOps

        return DeviceOps

    def get_ops(self) -> DeviceOps:
        """The process-wide ops singleton; ``ensure_native()`` runs exactly once.

        A failure inside ``ensure_native`` is logged and the ops stay on the torch baseline:
        a broken native module must never take the whole device down.
        """
        if self._ops_cache is not None:
            return self._ops_cache
        with self._ops_lock:
            if self._ops_cache is None:
                ops = self.ops_cls()
                try:
                    ops.ensure_native()
                except Exception as exc:  # fail soft, as the guide requires
                    logger.warning(
                        "Backend %r: ensure_native() failed (%s: %s); using the torch "
                        "baseline for all ops.",
                        self.backend_name,
                        type(exc).__name__,
                        exc,
                    )
                self._ops_cache = ops
        return self._ops_cache

    # -- transfer-mode capabilities -----------------------------------------------------
    def is_lmcache_driven_available(self) -> bool:
        """Whether the LMCache-driven (server reads worker memory) path is implemented."""
        return False

    def default_mp_transfer_mode(self) -> MPTransferMode:
        """Mode chosen under AUTO for this backend; never returns AUTO."""
        if self.is_lmcache_driven_available():
            return MPTransferMode.LMCACHE_DRIVEN
        return MPTransferMode.ENGINE_DRIVEN

    @property
    def ipc_wrapper_cls(self) -> type[DeviceIPCWrapper] | None:
        """``DeviceIPCWrapper`` subclass (with a ``wrap`` classmethod) for LMCache-driven mode."""
        return None

    def is_handle_transfer_available(self) -> bool:
        """Whether memory handles of this device can be shared with another process."""
        return True

    @property
    def event_ipc_backend(self) -> EventIPCBackend | None:
        """Event-IPC capability for LMCache-driven mode; ``None`` means unsupported."""
        return None

    def create_cache_context(self, *args: object, **kwargs: object) -> BaseCacheContext:
        """Build this device's ``BaseCacheContext``; required for LMCache-driven mode."""
        raise NotImplementedError(
            f"DeviceSpec {type(self).__name__} (backend {self.backend_name!r}) does not "
            "implement create_cache_context(); LMCache-driven transfer is unavailable for it."
        )

    # -- host pinning -------------------------------------------------------------------
    @property
    def pin_memory_backend(self) -> type[PinMemoryBackend] | None:
        """Optional ``PinMemoryBackend`` subclass for host staging buffers."""
        return None

    def _get_pin_backend(self) -> PinMemoryBackend:
        if self._pin_backend_cache is None:
            from lmcache.v1.platform.base.pin_memory import PinMemoryBackend

            backend_cls = self.pin_memory_backend or PinMemoryBackend
            self._pin_backend_cache = backend_cls()
        return self._pin_backend_cache

    def pin_memory(self, ptr: int, size: int, flags: int = 0) -> bool:
        return self._get_pin_backend().pin_memory(ptr, size, flags)

    def unpin_memory(self, ptr: int) -> bool:
        return self._get_pin_backend().unpin_memory(ptr)

    @property
    def is_pin_supported(self) -> bool:
        return self._get_pin_backend().is_pin_supported

    # -- streams ------------------------------------------------------------------------
    def _get_torch_module(self) -> TorchDeviceModule:
        import torch

        module = getattr(torch, self.torch_module_name, None) if self.torch_module_name else None
        if module is None:
            raise RuntimeError(
                f"backend {self.backend_name!r}: torch has no module "
                f"{self.torch_module_name!r} for device type {self.device_type!r}"
            )
        return module

    def current_stream(self, device: DeviceLike = None) -> DeviceStream:
        return self._get_torch_module().current_stream(device)

    def get_stream_handle(self, stream: DeviceStream) -> int:
        raise NotImplementedError(
            f"backend {self.backend_name!r} does not expose raw stream handles"
        )

    def synchronize_stream(self, stream: DeviceStream) -> None:
        stream.synchronize()

    def synchronize_device(self, device: DeviceLike = None) -> None:
        self._get_torch_module().synchronize(device)

    def create_stream_event(self, device: DeviceLike = None) -> StreamEvent:
        return self._get_torch_module().Event()

    def record_stream_event(self, event: StreamEvent, stream: DeviceStream) -> None:
        event.record(stream)

    def is_stream_event_complete(self, event: StreamEvent) -> bool:
        return bool(event.query())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(backend_name={self.backend_name!r}, "
            f"device_type={self.device_type!r})"
        )
