"""Worker-side transfer contexts (see :mod:`.worker_transfer`).

Also re-exports upstream LMCache 0.5.6's package-level names (the engine-driven transport
interface and gather/scatter helpers of :mod:`.base`, the asynchronous context of
:mod:`.async_engine_driven`), so ``from lmcache.v1.multiprocess.transfer_context import X``
works for each.
"""

from lmcache.v1.multiprocess.transfer_context.async_engine_driven import (
    AsyncEngineDrivenTransferContext,
)
from lmcache.v1.multiprocess.transfer_context.base import (
    EngineDrivenContext,
    EngineDrivenContextMetadata,
    compute_kv_layout,
    gather_paged_kv_to_cpu,
    scatter_cpu_to_paged_kv,
)
from lmcache.v1.multiprocess.transfer_context.transports import (
    EngineDrivenContextInline,
    EngineDrivenContextShm,
    create_engine_driven_context,
)
from lmcache.v1.multiprocess.transfer_context.worker_transfer import (
    EngineDrivenTransferContext,
    LMCacheDrivenTransferContext,
    MPTransferMode,
    TransferContext,
    create_transfer_context,
)

__all__ = [
    "AsyncEngineDrivenTransferContext",
    "EngineDrivenContext",
    "EngineDrivenContextInline",
    "EngineDrivenContextMetadata",
    "EngineDrivenContextShm",
    "EngineDrivenTransferContext",
    "LMCacheDrivenTransferContext",
    "MPTransferMode",
    "TransferContext",
    "compute_kv_layout",
    "create_engine_driven_context",
    "create_transfer_context",
    "gather_paged_kv_to_cpu",
    "scatter_cpu_to_paged_kv",
]
