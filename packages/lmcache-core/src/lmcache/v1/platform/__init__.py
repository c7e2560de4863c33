"""The device platform layer: backend registry, selection and device-agnostic helpers.

Nothing here touches a plugin at import time: the registry is built lazily on first use
(``torch_dev``, ``torch_device_type``, ``current_device_spec`` or any function below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.notifiers import HAS_EVENTFD, consume_fd, create_event_notifier
from lmcache.v1.platform.ops_resolver import set_device_ops_resolver
from lmcache.v1.platform.registry import (
    DEVICE_BACKEND_ENV_VAR,
    DEVICE_PLUGIN_ENTRY_POINT_GROUP,
    DEVICE_TYPE_ENV_VAR,
    get_device_spec,
    get_registry,
    get_selection,
    get_torch_device,
)
from lmcache.v1.platform.registry import current_device_spec as get_current_device_spec

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import torch

    from lmcache.v1.platform.base.device_ops import DeviceOps
    from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
    from lmcache.v1.platform.base.streams import DeviceLike

# Upstream exposes the *selected spec instance* under this name; we keep the name.
_LAZY_ATTRIBUTES = ("torch_dev", "torch_device_type", "current_device_spec")


def __getattr__(name: str) -> Any:
    if name == "DeviceOps":
        # Lazy: importing DeviceOps pulls in torch and the baseline ops, which entry-point
        # plugin modules must not pay for while the registry is being built.
        from lmcache.v1.platform.base.device_ops import DeviceOps

        return DeviceOps
    if name == "torch_dev":
        return get_torch_device()[0]
    if name == "torch_device_type":
        return get_torch_device()[1]
    if name == "current_device_spec":
        return get_current_device_spec()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _resolve_device_spec(device_type: str) -> DeviceSpec:
    spec = get_device_spec(device_type)
    if spec is None:
        known = ", ".join(sorted(get_registry().by_device_type())) or "(none)"
        raise RuntimeError(
            f"No DeviceSpec registered for accelerator {device_type!r}; refusing to silently "
            f"fall back to the torch baseline on accelerator hardware. Registered device "
            f"types: {known}. Install the vendor plugin wheel or run `lmcache devices`."
        )
    return spec


def resolve_device_ops(device_type: str | None = None) -> DeviceOps:
    """The ops singleton of the backend serving ``device_type`` (default: the selected one)."""
    if device_type is None:
        return get_selection().spec.get_ops()
    return _resolve_device_spec(device_type).get_ops()


# torch_ops reaches other backends' ops through this hook (it sits below the registry).
# Through a lambda: the name is looked up at call time, so a replaced resolve_device_ops
# (tests swap it) is the one used.
set_device_ops_resolver(lambda device_type: resolve_device_ops(device_type))


def serving_device_type(torch_device_type: str) -> str:
    """The device type whose backend serves tensors on the torch device ``torch_device_type``.

    Usually that same name.  A *selected* backend whose torch module is that device but whose
    device type differs (a backend over another device's memory, such as a host-memory
    simulator) serves them instead, so its wrapper, cache context and event IPC are used.
    """
    spec = get_selection().spec
    if spec.torch_module_name == torch_device_type and spec.device_type != torch_device_type:
        return spec.device_type
    return torch_device_type


def resolve_kv_wrapper_factory(
    device_type: str,
) -> Callable[[torch.Tensor | Sequence[torch.Tensor]], DeviceIPCWrapper]:
    """``ipc_wrapper_cls.wrap`` of the backend serving ``device_type``."""
    spec = get_device_spec(device_type)
    wrapper_cls = spec.ipc_wrapper_cls if spec is not None else None
    if wrapper_cls is None:
        raise ValueError(f"No KV-cache wrapper factory registered for device type {device_type!r}")
    factory: Callable[[torch.Tensor | Sequence[torch.Tensor]], DeviceIPCWrapper] = getattr(
        wrapper_cls, "wrap", wrapper_cls
    )
    return factory


def synchronize_device(device: DeviceLike) -> None:
    """Wait for all work on ``device``; a no-op for cpu."""
    device_type = getattr(device, "type", str(device).split(":", 1)[0])
    if device_type == "cpu":
        return
    _resolve_device_spec(device_type).synchronize_device(device)


__all__ = [
    "DEVICE_BACKEND_ENV_VAR",
    "DEVICE_PLUGIN_ENTRY_POINT_GROUP",
    "DEVICE_TYPE_ENV_VAR",
    "DeviceOps",
    "DeviceSpec",
    "HAS_EVENTFD",
    "consume_fd",
    "create_event_notifier",
    "current_device_spec",
    "get_current_device_spec",
    "get_device_spec",
    "get_registry",
    "get_selection",
    "get_torch_device",
    "resolve_device_ops",
    "resolve_kv_wrapper_factory",
    "serving_device_type",
    "synchronize_device",
    "torch_dev",
    "torch_device_type",
]
