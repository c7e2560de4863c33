"""The device runtime for plugins: the selected backend's torch device module, resolved
the way the torch baseline resolves it (the kit's name for ``torch_ops.utils``)."""

from __future__ import annotations

from lmcache.v1.platform.torch_ops.utils import device_runtime, get_gpu_pci_bus_id

__all__ = ["device_runtime", "get_gpu_pci_bus_id"]
