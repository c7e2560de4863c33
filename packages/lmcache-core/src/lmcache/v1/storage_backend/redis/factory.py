"""The Redis tier built from upstream's ``--l2-adapter`` JSON (``lmcache server``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from lmcache.v1.config import LMCacheEngineConfig, LMCacheMetadata
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.redis.backend import RedisBackend
from lmcache.v1.storage_backend.redis.settings import RedisSettings


def create_from_l2_adapter(
    spec: str | Mapping[str, Any],
    local_cpu_backend: LocalCPUBackend | None = None,
    *,
    config: LMCacheEngineConfig | None = None,
    metadata: LMCacheMetadata | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
    dst_device: str = "cpu",
) -> RedisBackend:
    """The Redis tier from upstream's ``--l2-adapter`` JSON (``type`` ``resp``, ``redis`` or
    ``valkey``).  Raises ``ValueError`` for a bad spec and :class:`RedisUnavailableError`
    when Redis is unreachable and the spec does not say ``"optional": true``."""
    return RedisBackend(
        dst_device=dst_device,
        config=config,
        metadata=metadata,
        local_cpu_backend=local_cpu_backend,
        loop=loop,
        settings=RedisSettings.from_l2_adapter(spec),
    )
