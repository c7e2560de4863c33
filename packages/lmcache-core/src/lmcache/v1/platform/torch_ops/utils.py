"""Device introspection helpers."""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["get_gpu_pci_bus_id"]


def get_gpu_pci_bus_id(device_id: int = 0) -> str | None:
    """PCI bus id (``dddd:bb:dd.0``) of a CUDA/ROCm device, or None without one."""
    if not torch.cuda.is_available() or device_id >= torch.cuda.device_count():
        return None
    props: Any = torch.cuda.get_device_properties(device_id)
    try:
        domain = int(props.pci_domain_id)
        bus = int(props.pci_bus_id)
        device = int(props.pci_device_id)
    except (AttributeError, TypeError, ValueError):
        logger.debug("device %d exposes no PCI location", device_id)
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def device_runtime() -> Any:
    """The CUDA/ROCm runtime library (ctypes), or None when no device is usable.

    Public for backends that call the runtime themselves (host registration); it is not
    a ``DeviceOps`` op, so it stays out of ``__all__`` and the ``torch_ops`` namespace.
    """
    from lmcache.v1.platform.torch_ops._tensor_from_ptr import _device_runtime

    return _device_runtime()
