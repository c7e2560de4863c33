"""The torch baseline for every ``DeviceOps`` op: plain torch, any device, no custom kernels.

Callers go through ``lmcache.device_ops`` (a ``DeviceOps`` instance that delegates here
unless a backend binds a native replacement); import this package directly only to fall back
to the generic semantics from inside a backend. Like upstream, the package re-exports each
module's ``__all__``.
"""

import sys

# Upstream's package namespace also carries the descriptor types of the kernel signatures
# (its modules have no __all__); callers written against it reach them here.
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc, TransferDirection
from lmcache.v1.platform.torch_ops._kv_format import *  # noqa: F403
from lmcache.v1.platform.torch_ops._tensor_from_ptr import *  # noqa: F403
from lmcache.v1.platform.torch_ops.cachegen_kernels import *  # noqa: F403
from lmcache.v1.platform.torch_ops.completion_recorder import *  # noqa: F403
from lmcache.v1.platform.torch_ops.event_recorder import *  # noqa: F403
from lmcache.v1.platform.torch_ops.mem_alloc import *  # noqa: F403
from lmcache.v1.platform.torch_ops.mem_kernels import *  # noqa: F403
from lmcache.v1.platform.torch_ops.mp_mem_kernels import *  # noqa: F403
from lmcache.v1.platform.torch_ops.pos_kernels import *  # noqa: F403
from lmcache.v1.platform.torch_ops.utils import *  # noqa: F403

_MODULES = (
    "_kv_format",
    "_tensor_from_ptr",
    "cachegen_kernels",
    "completion_recorder",
    "event_recorder",
    "mem_alloc",
    "mem_kernels",
    "mp_mem_kernels",
    "pos_kernels",
    "utils",
)
# Looked up in sys.modules: the function _tensor_from_ptr shadows its module's attribute.
__all__ = [
    "EngineKVFormat",
    "PageBufferShapeDesc",
    "TransferDirection",
    *(name for module in _MODULES for name in sys.modules[f"{__name__}.{module}"].__all__),
]
