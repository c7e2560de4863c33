"""Worker-side transfer contexts: how a worker's KV blocks reach the cache server.

* :class:`LMCacheDrivenTransferContext` (:mod:`.lmcache_driven`) registers the worker's KV
  tensors and sends ``store``/``retrieve``; the *server* copies from/to the worker's memory.
* :class:`EngineDrivenTransferContext` (:mod:`.engine_driven`) copies itself, through the
  server's shared memory (SHM sub-path) or inside the messages (inline sub-path).

:func:`create_transfer_context` picks one: explicit ``mode`` argument, else
``LMCACHE_MP_TRANSFER_MODE``, else AUTO, which dispatches strictly by device type (``cuda``
-> LMCache-driven, everything else -> engine-driven).  This module is the path the seeds
name: it keeps exporting every name it always had.

Upstream 0.5.6's names live here too: the module-level ``gather_paged_kv_to_cpu``,
``scatter_cpu_to_paged_kv``, ``synchronize_device`` and ``create_engine_driven_context``,
which this module installs as the engine-driven context's hooks (looked up at call time,
so replacing them here takes effect), ``torch_dev``,
and ``_build_engine_driven_context``, which picks
:class:`~.async_engine_driven.AsyncEngineDrivenTransferContext` where the device has
streams, events and pinned memory.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from lmcache.v1.multiprocess.transfer_context.base import (
    EngineDrivenContext,
    EngineDrivenContextMetadata,
    QueryableFuture,
    TransferContext,
    _done,
    _failed,
    _single_group_block_ids,
    _tensor_list,
    compute_kv_layout,
    gather_paged_kv_to_cpu,
    scatter_cpu_to_paged_kv,
)
from lmcache.v1.multiprocess.transfer_context.engine_driven import (
    _SHM_DIR,
    ENV_ENGINE_DRIVEN_SUB_PATH,
    SUB_PATH_INLINE,
    SUB_PATH_SHM,
    EngineDrivenHooks,
    EngineDrivenTransferContext,
    _requested_sub_path,
)
from lmcache.v1.multiprocess.transfer_context.lmcache_driven import (
    LMCacheDrivenTransferContext,
    declared_layout_hints,
    require_event_ipc,
)
from lmcache.v1.multiprocess.transfer_context.transports import create_engine_driven_context
from lmcache.v1.platform import (
    get_device_spec,
    get_torch_device,
    serving_device_type,
    synchronize_device,
)
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
from lmcache.v1.platform.transfer_mode import (
    ENV_MP_TRANSFER_MODE,
    MPTransferMode,
    resolve_transfer_mode,
)

__all__ = [
    "ENV_ENGINE_DRIVEN_SUB_PATH",
    "ENV_MP_TRANSFER_MODE",
    "EngineDrivenContext",
    "EngineDrivenContextMetadata",
    "MPTransferMode",
    "_build_engine_driven_context",
    "_single_group_block_ids",
    "_supports_async_primitives",
    "compute_kv_layout",
    "create_engine_driven_context",
    "gather_paged_kv_to_cpu",
    "scatter_cpu_to_paged_kv",
    "synchronize_device",
    "SUB_PATH_INLINE",
    "SUB_PATH_SHM",
    "EngineDrivenTransferContext",
    "LMCacheDrivenTransferContext",
    "QueryableFuture",
    "TransferContext",
    "_SHM_DIR",
    "_done",
    "_failed",
    "_requested_sub_path",
    "_tensor_list",
    "create_transfer_context",
    "declared_layout_hints",
    "require_event_ipc",
]

logger = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    # ``torch_dev`` (upstream's name for the selected backend's torch module) resolves on
    # first use: the backend registry is not built at import time.
    if name == "torch_dev":
        return get_torch_device()[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _torch_dev() -> Any:
    """``torch_dev`` as seen through this module (a replaced one included)."""
    return sys.modules[__name__].torch_dev


def _supports_async_primitives() -> bool:
    """Whether the selected device offers what the asynchronous store needs.

    A stream, events with ``record`` / ``synchronize`` / ``wait``, and pinned host memory.
    The host itself (``torch.cpu``) has no asynchronous copies to overlap.
    """
    dev = _torch_dev()
    if not hasattr(dev, "Stream") or not hasattr(dev, "Event"):
        return False
    if getattr(dev, "__name__", "") == "torch.cpu":
        return False
    is_available = getattr(dev, "is_available", None)
    if callable(is_available) and not is_available():
        return False
    try:
        dev.Stream()
        event = dev.Event()
    except Exception:
        return False
    if not all(callable(getattr(event, name, None)) for name in ("record", "synchronize", "wait")):
        return False
    try:
        torch.empty(1, dtype=torch.uint8, pin_memory=True)
    except (RuntimeError, TypeError):
        return False
    return True


# Upstream 0.5.6's code replaces these names on this module (create_engine_driven_context,
# gather_paged_kv_to_cpu, scatter_cpu_to_paged_kv, synchronize_device), so the engine-driven
# context looks them up here at call time.
EngineDrivenTransferContext.hooks = cast("EngineDrivenHooks", sys.modules[__name__])


def _build_engine_driven_context(
    instance_id: int, req_client: Any, sub_path: str | None = None
) -> EngineDrivenTransferContext:
    """The asynchronous engine-driven context where the device supports it, else the
    synchronous one."""
    if _supports_async_primitives():
        from lmcache.v1.multiprocess.transfer_context.async_engine_driven import (
            AsyncEngineDrivenTransferContext,
        )

        logger.info("engine-driven stores run asynchronously")
        return AsyncEngineDrivenTransferContext(instance_id, req_client, sub_path=sub_path)
    return EngineDrivenTransferContext(instance_id, req_client, sub_path=sub_path)


def _build_lmcache_driven_context(
    device_type: str, instance_id: int, req_client: Any
) -> LMCacheDrivenTransferContext:
    """The two hard checks (wrapper with ``wrap``; handle transfer), then the context."""
    spec = get_device_spec(device_type)
    backend_name = spec.backend_name if spec is not None else device_type
    wrapper_cls = spec.ipc_wrapper_cls if spec is not None else None
    wrap = getattr(wrapper_cls, "wrap", None)
    overridden = wrap is not None and getattr(wrap, "__func__", None) is not getattr(
        DeviceIPCWrapper.wrap, "__func__", None
    )
    if wrapper_cls is None or not overridden:
        raise ValueError(
            f"MP transfer mode 'lmcache_driven' is not supported for device type "
            f"{device_type!r} (backend {backend_name!r}): no KV-cache wrapper factory is "
            f"registered (DeviceSpec.ipc_wrapper_cls must name a DeviceIPCWrapper subclass "
            f"with a wrap classmethod). Use mode 'engine_driven' instead."
        )
    assert spec is not None
    if not spec.is_handle_transfer_available():
        raise ValueError(
            f"MP transfer mode 'lmcache_driven' is not supported for device type "
            f"{device_type!r} (backend {backend_name!r}): IPC handle transfer is unavailable "
            f"(DeviceSpec.is_handle_transfer_available() returned False). Use mode "
            f"'engine_driven' instead."
        )
    return LMCacheDrivenTransferContext(instance_id, req_client, device_type)


def create_transfer_context(
    kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
    *,
    instance_id: int,
    req_client: Any,
    mode: str | MPTransferMode | None = None,
    **kwargs: Any,
) -> TransferContext:
    """The transfer context for ``kv_caches`` (see the module docstring for the rules).

    ``sub_path`` (``auto`` / ``shm`` / ``inline``, or ``LMCACHE_MP_ENGINE_DRIVEN_SUB_PATH``)
    forces the engine-driven sub-path.
    """
    tensors = _tensor_list(kv_caches)
    if not tensors:
        raise ValueError("create_transfer_context needs at least one KV-cache tensor")
    device_types = {t.device.type for t in tensors}
    if len(device_types) != 1:
        raise ValueError(f"KV-cache tensors span several device types: {sorted(device_types)}")
    (device_type,) = device_types
    device_type = serving_device_type(device_type)
    resolved = resolve_transfer_mode(mode)
    if resolved is MPTransferMode.AUTO:
        resolved = (
            MPTransferMode.LMCACHE_DRIVEN if device_type == "cuda" else MPTransferMode.ENGINE_DRIVEN
        )
    logger.info("Creating transfer context (device_type=%s, mode=%s)", device_type, resolved.value)
    if resolved is MPTransferMode.LMCACHE_DRIVEN:
        return _build_lmcache_driven_context(device_type, instance_id, req_client)
    return EngineDrivenTransferContext(instance_id, req_client, sub_path=kwargs.get("sub_path"))
