"""The registry of workers: lookup, registration room, replacement, release and reaping.

A peer can name any instance id, so the registry is bounded (``MAX_REGISTERED_WORKERS``);
a worker silent for ``worker_reap_timeout_seconds`` is dropped and its shared memory
unmapped (and unlinked only where the segment's creator is provably gone).
"""

from __future__ import annotations

import logging
import time

from lmcache.v1.multiprocess.server.state import ServerCore, Worker
from lmcache.v1.multiprocess.server.tenants import current_tenant
from lmcache.v1.multiprocess.wire.protocol import ErrorCode, ProtocolError
from lmcache.v1.platform.transfer_mode import MPTransferMode

logger = logging.getLogger(__name__)

MAX_REGISTERED_WORKERS = 4096


class WorkerRegistry(ServerCore):
    """Registered workers of both transfer modes (``self._workers``)."""

    def _worker(self, instance_id: int, mode: MPTransferMode) -> Worker:
        with self._workers_lock:
            worker = self._workers.get(instance_id)
        # Another tenant's worker reads exactly like no worker: ids reveal nothing.
        if worker is None or worker.mode is not mode or not self._owns_worker(worker):
            raise ProtocolError(
                ErrorCode.UNKNOWN_WORKER,
                f"no {mode.value} KV cache is registered for instance id {instance_id} "
                f"(never registered, unregistered, or reaped after "
                f"{self.settings.worker_reap_timeout_seconds:.0f}s without contact); "
                f"register it again",
            )
        worker.last_seen = time.monotonic()
        return worker

    def _check_worker_room(self, instance_id: int, operation: str) -> None:
        with self._workers_lock:
            full = instance_id not in self._workers and len(self._workers) >= (
                MAX_REGISTERED_WORKERS
            )
        if full:
            raise ProtocolError(
                ErrorCode.OUT_OF_MEMORY,
                f"{operation}: {MAX_REGISTERED_WORKERS} workers are already registered; "
                f"unregister idle ones (or wait for the reaper) before registering more",
            )

    def _check_registration(self, instance_id: int, model_name: str, operation: str) -> None:
        """Before anything is mapped: the tenant's model, and no other tenant's id."""
        self._check_model(model_name, operation)
        tenant = current_tenant()
        with self._workers_lock:
            old = self._workers.get(instance_id)
        if tenant is not None and old is not None and old.tenant != tenant.name:
            raise self._forbid(tenant, operation, f"take over instance id {instance_id}")

    def _check_segments_free(self, context: object, operation: str) -> None:
        """With tenants: a KV cache whose shared memory another tenant's live worker
        registered is refused (through the server it would read or overwrite those pages).
        Segments of no live registration prove nothing either way (docs/operations.md)."""
        tenant = current_tenant()
        names = set(getattr(context, "shm_names", None) or [])
        if tenant is None or not names:
            return
        with self._workers_lock:
            others = [w for w in self._workers.values() if w.tenant != tenant.name]
        for other in others:
            if names & set(getattr(other.context, "shm_names", None) or []):
                raise self._forbid(tenant, operation, "register another tenant's KV memory")

    def _replace_worker(self, instance_id: int, worker: Worker) -> None:
        tenant = current_tenant()
        worker.tenant = None if tenant is None else tenant.name
        with self._workers_lock:
            old = self._workers.get(instance_id)
            if old is not None and not self._owns_worker(old):
                taken = True
            else:
                taken = False
                self._workers.pop(instance_id, None)
                self._workers[instance_id] = worker
        if taken:  # registered by another tenant meanwhile
            assert tenant is not None
            if worker.context is not None:
                worker.context.close()
            raise self._forbid(tenant, "register", f"take over instance id {instance_id}")
        if old is not None:
            self._release_worker(instance_id, old, unlink=False)

    def _drop_worker(self, instance_id: int, mode: MPTransferMode, unlink: bool = False) -> bool:
        with self._workers_lock:
            worker = self._workers.get(instance_id)
            if worker is None or worker.mode is not mode or not self._owns_worker(worker):
                return False
            del self._workers[instance_id]
        self._release_worker(instance_id, worker, unlink)
        return True

    def _release_worker(self, instance_id: int, worker: Worker, unlink: bool) -> None:
        self._pending.drop(lambda iid: iid == instance_id)
        if worker.context is None:
            return
        with worker.lock:  # wait for an in-flight copy into its pages
            names = list(getattr(worker.context, "shm_names", []))
            worker.context.close()
        if unlink and self._unlink_orphaned_segment is not None:
            for name in set(names):
                self._unlink_orphaned_segment(name)

    def ping(self, instance_id: int | None = None) -> bool:
        if instance_id is None:
            return True
        with self._workers_lock:
            worker = self._workers.get(instance_id)
        if worker is None or not self._owns_worker(worker):
            return False
        worker.last_seen = time.monotonic()
        return True

    def worker_counts(self) -> dict[str, int]:
        with self._workers_lock:
            modes = [w.mode.value for w in self._workers.values()]
        return {
            m.value: modes.count(m.value) for m in MPTransferMode if m is not MPTransferMode.AUTO
        }

    def _reap_workers(self, now: float) -> None:
        timeout = self.settings.worker_reap_timeout_seconds
        if timeout <= 0:
            return
        with self._workers_lock:
            stale = [(i, w.mode) for i, w in self._workers.items() if now - w.last_seen > timeout]
        for instance_id, mode in stale:
            if self._drop_worker(instance_id, mode, unlink=True):
                logger.warning(
                    "reaped worker %d: no contact for %.0fs; its shared memory is unmapped "
                    "(and unlinked where the segment's creator is gone)",
                    instance_id,
                    timeout,
                )

    def _close_workers(self) -> None:
        with self._workers_lock:
            workers = list(self._workers.items())
            self._workers.clear()
        for instance_id, worker in workers:
            self._release_worker(instance_id, worker, unlink=False)
