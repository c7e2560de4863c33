"""The module ``CpuNativeDeviceOps`` hands to ``DeviceOps.bind_native``.

``bind_native`` overlays every public callable and class found here: the kit's KV ops over
the host kernels (``torch_ops`` names and signatures), the CPU-only ops and the native plan
types, and nothing else. Importing it loads the C++ extension; an ``ImportError`` here means
the native path is unavailable and the backend stays on the torch baseline.
"""

from lmcache.v1.platform.kernel_kit.ops import kv_ops as _kv_ops
from lmcache_cpu._kernels import CpuKernels as _CpuKernels
from lmcache_cpu._kernels import batched_memcpy, calculate_cdf
from lmcache_cpu._native import BatchStep, KernelGroupSpec, LaunchVar, StagingCopy

_KV_OPS = _kv_ops(_CpuKernels())
globals().update(_KV_OPS)

__all__ = [
    "BatchStep",
    "KernelGroupSpec",
    "LaunchVar",
    "StagingCopy",
    "batched_memcpy",
    "calculate_cdf",
]
__all__ += sorted(_KV_OPS)
