"""Re-export of the cache server handler, which lives in :mod:`lmcache.v1.multiprocess.server`
(split by operation family); kept so existing imports keep working."""

from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.pending import MAX_PENDING_TRANSFERS
from lmcache.v1.multiprocess.server.rate_limited_logs import RefusalLog as _RefusalLog
from lmcache.v1.multiprocess.server.state import DIRECT_SUB_PATH, CacheServerSettings
from lmcache.v1.multiprocess.server.workers import MAX_REGISTERED_WORKERS

__all__ = [
    "DIRECT_SUB_PATH",
    "MAX_PENDING_TRANSFERS",
    "MAX_REGISTERED_WORKERS",
    "CacheServerSettings",
    "MPCacheServer",
    "_RefusalLog",
]
