"""LMCache-driven transfer: the server copies straight from/to the worker's KV memory.

The worker registers its KV tensors (wrapped with the device's ``DeviceIPCWrapper``) and
sends ``store``/``retrieve``; device events order the server's copies with the engine's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from lmcache.v1.multiprocess.transfer_context.base import (
    TransferContext,
    _done,
    _failed,
    _tensor_list,
)
from lmcache.v1.multiprocess.wire.custom_types import EngineType, IPCCacheServerKey
from lmcache.v1.platform import get_device_spec
from lmcache.v1.platform.base.event_ipc import EventIPCBackend
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
from lmcache.v1.platform.kv_layout import KVLayout
from lmcache.v1.platform.transfer_mode import MPTransferMode

logger = logging.getLogger(__name__)


def require_event_ipc(device_type: str, device: Any) -> EventIPCBackend:
    """The device's event-IPC backend, or ``ValueError`` naming what is missing."""
    spec = get_device_spec(device_type)
    backend_name = spec.backend_name if spec is not None else device_type
    backend = spec.event_ipc_backend if spec is not None else None
    if backend is None:
        raise ValueError(
            f"MP transfer mode 'lmcache_driven' needs event IPC, but backend {backend_name!r} "
            f"(device type {device_type!r}) declares none (DeviceSpec.event_ipc_backend is "
            f"None). Use mode 'engine_driven' instead."
        )
    try:
        backend.check_event_support(device)
    except RuntimeError as exc:
        raise ValueError(
            f"MP transfer mode 'lmcache_driven' needs event IPC, but backend {backend_name!r} "
            f"cannot provide it for {device!r}: {exc}. Use mode 'engine_driven' instead."
        ) from exc
    return backend


def declared_layout_hints(layout: KVLayout, layout_hints: Any = None) -> dict[str, Any]:
    """The ``layout_hints`` payload of ``register_kv_cache``: always a dict, and naming NHD
    for a 5-D KV cache, since upstream LMCache's server otherwise reads
    ``[2, NB, X, Y, HS]`` as HND (heads before block slots) and mis-slices every block."""
    hints: dict[str, Any] = dict(layout_hints or {})
    if not layout.use_mla:
        hints.setdefault("kv_layout", "NHD")
    return hints


class LMCacheDrivenTransferContext(TransferContext):
    """The server reads/writes the worker's registered KV cache directly (zero-copy)."""

    mode = MPTransferMode.LMCACHE_DRIVEN

    def __init__(self, instance_id: int, req_client: Any, device_type: str) -> None:
        super().__init__(instance_id, req_client)
        self.device_type = device_type
        self._wrappers: list[DeviceIPCWrapper] = []
        self._events: EventIPCBackend | None = None
        self._registered = False
        self._registration: tuple[Any, ...] = ()

    def register(
        self,
        kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
        model_name: str,
        world_size: int,
        blocks_in_chunk: int,
        mq_timeout: float,
        layout_hints: Any = None,
        engine_group_infos: Sequence[Any] = (),
        engine_type: EngineType = EngineType.VLLM,
    ) -> None:
        from lmcache.v1.platform.kv_wrap import wrap_kv_caches

        kv = _tensor_list(kv_caches)
        self._events = require_event_ipc(self.device_type, kv[0].device)
        layout = self._setup(kv, blocks_in_chunk, layout_hints)
        self._wrappers = wrap_kv_caches(kv, self.device_type)
        self._registration = (
            self.instance_id,
            self._wrappers,
            model_name,
            world_size,
            engine_type.value,
            declared_layout_hints(layout, layout_hints),
            list(engine_group_infos),
        )
        self.register_again()

    def register_again(self) -> None:
        # The wrappers name the same (still mapped) memory: a new server maps it afresh.
        if not self._registration:
            raise RuntimeError("register_again before register")
        self.req_client.register_kv_cache(*self._registration)
        self._registered = True

    def unregister(self) -> Future[Any] | None:
        if not self._registered:
            return None
        self._registered = False
        self.req_client.unregister_kv_cache(self.instance_id)
        return _done(None)

    @property
    def _event_ipc(self) -> EventIPCBackend:
        if self._events is None:
            raise RuntimeError("the KV cache is not registered (no event IPC backend yet)")
        return self._events

    def create_recorded_event(self) -> Any:
        device = self._kv[0].device if self._kv else self.device_type
        event = self._event_ipc.create_event(device)
        self._event_ipc.record_event(event, None)
        return event

    def _handle(self, event: Any) -> bytes:
        if event is None:
            event = self.create_recorded_event()
        device = self._kv[0].device if self._kv else self.device_type
        return bytes(self._event_ipc.export_event(event, device))

    def _await_server_event(self, handle: bytes) -> None:
        if handle:
            device = self._kv[0].device if self._kv else self.device_type
            events = self._event_ipc
            events.synchronize_event(events.import_event(handle, device), device)

    def submit_store(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: Any,
        blocks_in_chunk: int,
    ) -> Future[bool]:
        try:
            handle, ok = self.req_client.store(
                key, self.instance_id, block_ids, self._handle(event)
            )
            self._await_server_event(handle)
            return _done(bool(ok))
        except Exception as exc:
            return _failed(exc)

    def submit_retrieve(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: Any,
        blocks_in_chunk: int,
        skip_first_n_tokens: int = 0,
    ) -> Future[bool]:
        try:
            handle, ok = self.req_client.retrieve(
                key, self.instance_id, block_ids, self._handle(event), skip_first_n_tokens
            )
            self._await_server_event(handle)
            return _done(bool(ok))
        except Exception as exc:
            return _failed(exc)

    def close(self) -> None:
        super().close()
        from lmcache.v1.platform.cpu.shm import CpuShmTensorWrapper, unlink_segment

        names = {w.shm_name for w in self._wrappers if isinstance(w, CpuShmTensorWrapper)}
        for wrapper in self._wrappers:
            wrapper.close()
        self._wrappers = []
        # The segments stay mapped (and valid) in this process; only the names go.
        for name in names - {""}:
            unlink_segment(name)
