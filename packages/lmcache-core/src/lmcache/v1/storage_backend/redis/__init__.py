"""The remote tier on Redis (RESP): one node or a Redis Cluster.

Modules, bottom up: :mod:`.settings` (options), :mod:`.breaker` (counters, circuit
breaker), :mod:`.codec` (values in the shared chunk format), :mod:`.connection` (clients),
:mod:`.cluster` (per-shard dispatch), :mod:`.backend` (:class:`RedisBackend`),
:mod:`.factory` (from ``--l2-adapter`` JSON).
"""

from lmcache.v1.storage_backend.redis.backend import RedisBackend
from lmcache.v1.storage_backend.redis.breaker import CircuitBreaker, RedisStats
from lmcache.v1.storage_backend.redis.codec import DecodedValue, decode_value, encode_value
from lmcache.v1.storage_backend.redis.connection import RedisUnavailableError
from lmcache.v1.storage_backend.redis.factory import create_from_l2_adapter
from lmcache.v1.storage_backend.redis.settings import (
    L2_ADAPTER_TYPES,
    OPTION_PREFIX,
    URL_SCHEMES,
    RedisSettings,
    is_redis_url,
)

__all__ = [
    "L2_ADAPTER_TYPES",
    "OPTION_PREFIX",
    "URL_SCHEMES",
    "CircuitBreaker",
    "DecodedValue",
    "RedisBackend",
    "RedisSettings",
    "RedisStats",
    "RedisUnavailableError",
    "create_from_l2_adapter",
    "decode_value",
    "encode_value",
    "is_redis_url",
]
