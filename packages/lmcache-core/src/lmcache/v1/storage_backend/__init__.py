"""Storage tiers: interfaces, the CPU (L1) and disk (L2) tiers, plugins and the manager.

``abstract_backend`` is the contract; ``storage_manager.StorageManager`` chains the tiers.
Nothing here imports :mod:`lmcache.v1.multiprocess`: the server sits on top of storage.
"""

from lmcache.v1.storage_backend.plugins import ENTRY_POINT_GROUP, storage_plugin_launcher
from lmcache.v1.storage_backend.storage_manager import (
    CreateStorageBackends,
    StorageManager,
    create_storage_backends,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "CreateStorageBackends",
    "StorageManager",
    "create_storage_backends",
    "storage_plugin_launcher",
]
