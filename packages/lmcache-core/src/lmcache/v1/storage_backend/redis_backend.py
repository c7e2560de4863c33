"""The seed's path of the Redis tier, kept for plugins and upstream users: the code lives in
the :mod:`lmcache.v1.storage_backend.redis` package (settings, breaker, codec, connections,
cluster, backend, factory)."""

from lmcache.v1.storage_backend.chunk_format import CorruptFileError
from lmcache.v1.storage_backend.redis.backend import RedisBackend
from lmcache.v1.storage_backend.redis.breaker import RedisStats
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
    "CorruptFileError",
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
