"""The module ``CudaDeviceOps`` hands to ``DeviceOps.bind_native``.

``bind_native`` overlays every public callable and class found here: the kit's KV ops over
the CUDA kernels (``torch_ops`` names and signatures) and nothing else. Importing it loads
the CUDA extension; an ``ImportError`` means the backend stays on the torch baseline.
"""

from lmcache.v1.platform.kernel_kit.ops import kv_ops as _kv_ops
from lmcache_cuda._kernels import CudaKernels as _CudaKernels

_KV_OPS = _kv_ops(_CudaKernels())
globals().update(_KV_OPS)

__all__ = sorted(_KV_OPS)
