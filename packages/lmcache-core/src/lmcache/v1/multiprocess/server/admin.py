"""Server-wide operations: admin (``clear``), handshake and liveness, stats and status.

``clear`` acts on every worker's data: it is refused unless the server runs with
``--enable-admin-ops`` and the admin token matches (see
:mod:`lmcache.v1.multiprocess.wire.security`).  ``get_stats``, ``status`` and
``metrics_state`` are what the wire, the HTTP frontend and Prometheus report.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec

from lmcache.v1.multiprocess.server.lookup import LookupOps
from lmcache.v1.multiprocess.server.state import DIRECT_SUB_PATH
from lmcache.v1.multiprocess.server.tenants import current_tenant
from lmcache.v1.multiprocess.server.tiers import (
    describe_tiers,
    tier_degradations,
    tier_problems,
)
from lmcache.v1.multiprocess.server.workers import WorkerRegistry
from lmcache.v1.multiprocess.wire.custom_types import (
    KV_EVENT_CAPABILITY,
    BlockAllocationRecord,
    KVEventBatch,
    ServerStats,
)
from lmcache.v1.multiprocess.wire.protocol import PROTOCOL_VERSION, ErrorCode, ProtocolError
from lmcache.v1.multiprocess.wire.security import TokenCheck
from lmcache.v1.platform.transfer_mode import MPTransferMode

logger = logging.getLogger(__name__)


class AdminOps(WorkerRegistry, LookupOps):
    """``clear``, ``get_chunk_size``, ``noop``, ``protocol_handshake``, ``get_stats`` and the
    observability the frontends read."""

    def clear(self, force: bool = False, admin_token: str | None = None) -> None:
        """Remove every cached object (an admin operation: see ``authorize_admin``)."""
        self.authorize_admin("clear", admin_token)
        removed = self.remove_all(force)
        logger.info("clear (admin request) removed %d objects (force=%s)", removed, force)

    def authorize_admin(self, operation: str, presented_token: str | None) -> None:
        """Refuse a wire admin operation unless --enable-admin-ops is on and the token
        (when one is configured) matches; raises ``ProtocolError``."""
        policy = self.settings.admin
        tenant = current_tenant()
        if tenant is not None and not tenant.admin:
            raise self._forbid(tenant, operation, "run admin operations (admin: false)")
        if not policy.wire_enabled:
            self._refusals.note(operation, "admin operations are off")
            raise ProtocolError(
                ErrorCode.FORBIDDEN,
                f"{operation} is an admin operation (it affects every worker's data) and this "
                f"server refuses admin operations; start it with --enable-admin-ops (and an "
                f"admin token, --admin-token-file) to allow them",
            )
        check = policy.check_token(presented_token)
        if check is TokenCheck.OK:
            return
        self._refusals.note(operation, f"{check.value} admin token")
        if check is TokenCheck.MISSING:
            message = (
                f"{operation} needs the server's admin token and none was presented; pass "
                f"it to MPClient(admin_token=...) or set LMCACHE_ADMIN_TOKEN"
            )
        else:
            message = f"{operation}: the admin token presented is wrong"
        raise ProtocolError(ErrorCode.UNAUTHORIZED, message)

    def check_admin_token(self, presented_token: str | None, where: str) -> TokenCheck:
        """The token check alone (the HTTP frontend has its own enable flags); a refusal is
        logged under ``where`` (e.g. ``HTTP /run_script``), rate-limited per ``where``."""
        check = self.settings.admin.check_token(presented_token)
        if check is not TokenCheck.OK:
            self._refusals.note(where, f"{check.value} admin token")
        return check

    def note_refusal(self, where: str, reason: str) -> None:
        """Log a refused request (rate-limited per ``where``), e.g. a missing read token."""
        self._refusals.note(where, reason)

    def remove_all(self, force: bool = False) -> int:
        """Remove every L1 object (and its lower-tier copies); returns how many went."""
        l1 = self.storage.local_cpu_backend
        # Tiers count only room-making drops, so these removals never show as evictions.
        return sum(bool(self.storage.remove(k, force=force)) for k in l1.get_keys())

    def get_chunk_size(self) -> int:
        return self.chunk_size

    def report_block_allocation(
        self, instance_id: int, model_name: str, records: list[BlockAllocationRecord]
    ) -> None:
        """Accepted and ignored: upstream's vLLM scheduler reports engine block allocations
        (fire-and-forget) for features we do not have (lazy offload, KV events)."""
        logger.debug("%d block-allocation records from %d ignored", len(records), instance_id)

    def noop(self) -> str:
        return "noop"

    def get_experimental(self) -> list[str]:
        return [KV_EVENT_CAPABILITY] if self.kv_events.enabled else []

    def subscribe_kv_events(
        self, instance_id: int, model_name: str, cursor: int, max_events: int
    ) -> KVEventBatch:
        """The next page of ``model_name``'s KV events after ``cursor`` (see
        :mod:`.kv_events`); answers at once, so a subscriber polls from ``next_cursor``."""
        del instance_id  # no per-subscriber state: any number may read the same log
        tenant = current_tenant()
        if tenant is None:
            return self.kv_events.read(model_name, cursor, max_events)
        self._check_model(model_name, "subscribe_kv_events")
        # Only the events of salts the tenant may read: the rest would name others' prompts.
        return self.kv_events.read(model_name, cursor, max_events, visible=tenant.may_read)

    def protocol_handshake(self, client_version: int) -> tuple[int, bool]:
        if client_version != PROTOCOL_VERSION:
            raise ProtocolError(
                ErrorCode.VERSION_MISMATCH,
                f"client speaks MP protocol version {client_version}, this server speaks "
                f"{PROTOCOL_VERSION}: upgrade the older side",
            )
        return PROTOCOL_VERSION, True

    def get_stats(self) -> ServerStats:
        if current_tenant() is not None:
            # Server-wide counters would show other tenants' traffic (and L1's segment name
            # its memory): a tenant sees the server's shape only.
            return ServerStats(
                supported_transfer_mode=self.stats.supported_transfer_mode,
                chunk_size=self.chunk_size,
                server_incarnation=self.stats.server_incarnation,
            )
        l1 = self.storage.local_cpu_backend
        with self._workers_lock:
            modes = [w.mode for w in self._workers.values()]
        pending = len(self._pending)
        with self._stats_lock:
            stats = msgspec.structs.replace(self.stats)
        stats.l1_chunks = len(l1)
        stats.l1_used_bytes = int(l1.used_bytes)
        stats.l1_capacity_bytes = int(l1.capacity_bytes)
        stats.lmcache_driven_workers = modes.count(MPTransferMode.LMCACHE_DRIVEN)
        stats.engine_driven_workers = modes.count(MPTransferMode.ENGINE_DRIVEN)
        stats.pending_prepares = pending
        return stats

    # -- observability ------------------------------------------------------------------------

    def health_problems(self) -> list[str]:
        """Why the server cannot serve (empty when healthy): broken tiers."""
        return tier_problems(self.storage)

    def health_degraded(self) -> list[str]:
        """What the server serves without for now (empty when nothing): unreachable
        remote tiers or shards, skipped behind their circuit breakers."""
        return tier_degradations(self.storage)

    def tiers(self) -> list[dict[str, Any]]:
        return describe_tiers(self.storage, self._evictions)

    def metrics_state(self) -> dict[str, Any]:
        """What the metrics read at scrape time."""
        return {
            "tiers": self.tiers(),
            "workers": self.worker_counts(),
            "pinned_objects": self.pinned_objects(),
            "healthy": not self.health_problems(),
            "salt_usage": self.storage.usage_bytes_by_tier(),
            "quotas": {
                q.cache_salt: q.limit_bytes for q in self.storage.quota_manager.list_quotas()
            },
        }

    def status(self) -> dict[str, Any]:
        """The ``/status`` document."""
        from lmcache import __version__

        stats = self.get_stats()
        with self._workers_lock:
            workers = [
                {
                    "instance_id": iid,
                    "model_name": w.model_name,
                    "world_size": w.world_size,
                    "transfer_mode": w.mode.value,
                    "sub_path": (
                        DIRECT_SUB_PATH
                        if w.mode is MPTransferMode.LMCACHE_DRIVEN
                        else ("inline" if w.inline else "shm")
                    ),
                    "idle_seconds": round(time.monotonic() - w.last_seen, 3),
                }
                for iid, w in self._workers.items()
            ]
        supported = self.settings.supported_transfer_mode
        modes = (
            [MPTransferMode.LMCACHE_DRIVEN.value, MPTransferMode.ENGINE_DRIVEN.value]
            if supported is MPTransferMode.AUTO
            else [supported.value]
        )
        problems = self.health_problems()
        return {
            "version": __version__,
            "instance_id": self.settings.instance_id,
            "incarnation": stats.server_incarnation,
            "uptime_seconds": round(time.time() - self.started_at, 3),
            "chunk_size": self.chunk_size,
            "healthy": not problems,
            "problems": problems,
            "degraded": self.health_degraded(),
            "supported_transfer_mode": supported.value,
            "transfer_modes": modes,
            "shm_name": self.shm_name,
            "metrics_enabled": self.metrics is not None,
            "tiers": self.tiers(),
            "workers": workers,
            "pinned_objects": self.pinned_objects(),
            "pending_prepares": stats.pending_prepares,
            "counters": {
                "stored_tokens": stats.stored_tokens,
                "retrieved_tokens": stats.retrieved_tokens,
                "stored_chunks": stats.stored_chunks,
                "retrieved_chunks": stats.retrieved_chunks,
                "lookup_hit_tokens": stats.lookup_hit_tokens,
                "errors": stats.errors,
                "dropped_replies": stats.dropped_replies,
            },
        }
