"""Worker-side transfer contexts (see :mod:`.worker_transfer`)."""

from lmcache.v1.multiprocess.transfer_context.worker_transfer import (
    EngineDrivenTransferContext,
    LMCacheDrivenTransferContext,
    TransferContext,
    create_transfer_context,
)

__all__ = [
    "EngineDrivenTransferContext",
    "LMCacheDrivenTransferContext",
    "TransferContext",
    "create_transfer_context",
]
