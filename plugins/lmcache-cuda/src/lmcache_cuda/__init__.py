"""lmcache-cuda: NVIDIA CUDA and AMD ROCm backends for LMCache's ``cuda`` device type.

Importing this package registers nothing and loads no CUDA code: the platform registry finds
:class:`lmcache_cuda.device.CudaDeviceSpec` and :class:`lmcache_cuda.device.RocmDeviceSpec`
through ``lmcache.device_plugins`` entry points, and the compiled extension is imported only
when the ops object of an available backend is first created.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
