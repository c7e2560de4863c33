"""``MPCacheServer``: what the cache server does for each operation (transport-free).

The operations live by family, each a mixin over the shared state of
:class:`~lmcache.v1.multiprocess.server.state.ServerCore`:

* :mod:`.workers` -- the registry of workers, ``ping``, reaping;
* :mod:`.lmcache_driven` -- ``register_kv_cache``, ``store``, ``retrieve`` (the server copies);
* :mod:`.engine_driven` -- ``prepare_*`` / ``commit_*`` (the worker copies), with the
  pending table (:mod:`.pending`) and the inline codec (:mod:`.inline_codec`);
* :mod:`.lookup` -- lookup sessions and prefetch status;
* :mod:`.objects` -- named objects (an engine's pages under its own names);
* :mod:`.admin` -- ``clear``, handshake, stats, status, health.

The wire table (:data:`~lmcache.v1.multiprocess.wire.protocol.RPC_SPECS`) names, for each
operation, the method of this class that serves it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from lmcache.v1.multiprocess.server.admin import AdminOps
from lmcache.v1.multiprocess.server.engine_driven import EngineDrivenOps
from lmcache.v1.multiprocess.server.lmcache_driven import LMCacheDrivenOps
from lmcache.v1.multiprocess.server.lookup import LookupOps
from lmcache.v1.multiprocess.server.metrics import ServerMetrics
from lmcache.v1.multiprocess.server.objects import ObjectOps
from lmcache.v1.multiprocess.server.state import CacheServerSettings
from lmcache.v1.multiprocess.server.workers import WorkerRegistry
from lmcache.v1.platform.cache_context import DeviceSpecLookup
from lmcache.v1.storage_backend.storage_manager import StorageManager

if TYPE_CHECKING:
    from lmcache.v1.multiprocess.server_config import MPServerConfig


class MPCacheServer(
    LMCacheDrivenOps, EngineDrivenOps, AdminOps, WorkerRegistry, LookupOps, ObjectOps
):
    """The cache server's state: L1/L2 storage, registered workers, pending transfers."""

    def __init__(
        self,
        settings: CacheServerSettings,
        storage: StorageManager,
        device_specs: DeviceSpecLookup | None = None,
        unlink_orphaned_segment: Callable[[str], bool] | None = None,
        enable_metrics: bool = True,
        server_config: MPServerConfig | None = None,
    ) -> None:
        """``unlink_orphaned_segment`` is called for each segment of a reaped worker; it
        must remove only segments whose creator is provably gone (any peer can register
        any segment, so the registration proves nothing).  ``server_config`` is the
        configuration the server was built from, kept to be reported (``GET /config``)."""
        super().__init__(settings, storage, device_specs, unlink_orphaned_segment)
        self.server_config = server_config
        if enable_metrics:
            self.metrics = ServerMetrics(self.metrics_state)

    def reap(self, now: float | None = None) -> None:
        """Drop expired pending transfers, silent workers and stale lookup sessions."""
        now = time.monotonic() if now is None else now
        self._pending.drop(
            lambda _iid: True, older_than=now - self.settings.pending_transfer_timeout_seconds
        )
        store_ttl = self.settings.prepared_store_ttl_seconds
        if store_ttl is not None:
            self._pending.drop(lambda _iid: True, older_than=now - store_ttl, stores_only=True)
        self._reap_workers(now)
        self._reap_lookups(now)

    def close(self) -> None:
        self._close_workers()
        self._pending.drop(lambda _iid: True)
        self._close_lookups()
        if self.prefetcher is not None:
            self.prefetcher.close()
        try:
            self.storage.close()
        finally:
            if self.metrics is not None:
                self.metrics.close()
