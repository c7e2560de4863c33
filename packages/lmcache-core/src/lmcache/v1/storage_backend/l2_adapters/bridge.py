"""The bridge: any :class:`L2AdapterInterface` as a storage tier of this server.

:class:`L2AdapterBackend` is a :class:`StorageBackendInterface`, so the storage manager
uses an adapter like the disk or Redis tier: puts are written through off the request
path, lookups and reads fall through L1 to it, hits are promoted into L1.

* **Keys**: each :class:`CacheEngineKey` becomes an :class:`ObjectKey`
  (:func:`~lmcache.v1.storage_backend.l2_adapters.keys.object_key_of`, tenant salt
  included).
* **Layouts**: an adapter stores bytes; to read a chunk back the bridge must allocate its
  buffer first, so it keeps an index of the keys it stored with their layout (shapes,
  dtypes, format, used size).  A key it did not store in this process is a miss (data an
  adapter kept from an earlier run is not adopted).  The index is a hint, the adapter is
  the truth: every lookup asks the adapter, a key it does not find leaves the index, and
  the adapter's delete notifications (its own eviction) remove keys too.
* **Completion**: one thread per bridge polls the adapter's three event descriptors (and
  wakes every ``poll_interval_s`` anyway, for adapters that do not signal), pops finished
  stores and asks for the results of the lookups and loads in flight.  Callers wait on a
  future for at most ``op_timeout_s``: nothing the adapter does can hang a request.
* **Errors are misses**: a failed or timed-out lookup or load, a load bit left clear, an
  exception from the adapter -- the key is a miss, the event is logged (rate limited), and
  no error reaches the engine.  Memory handed to the adapter is never reused before the
  adapter is done with it: a timed-out load's buffer is released when its result comes
  (or at close), a store's objects stay referenced until the store finishes.
* **Off the request path**: a put only queues; a thread of the bridge submits the store
  task, so even an adapter whose submit blocks cannot hold up the caller.
* **Bounded**: at most ``put_queue_chunks`` chunks wait to be stored; more are refused
  (logged) rather than queued, so a stuck adapter cannot pin all of L1.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import select
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import torch

from lmcache.logging import RateLimitedLog
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.storage_backend.abstract_backend import (
    AllocatorBackendInterface,
    StorageBackendInterface,
)
from lmcache.v1.storage_backend.chunk_format import allocate_for_read
from lmcache.v1.storage_backend.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.storage_backend.l2_adapters.bitmap import Bitmap
from lmcache.v1.storage_backend.l2_adapters.config import L2EvictionSpec
from lmcache.v1.storage_backend.l2_adapters.keys import object_key_of
from lmcache.v1.storage_backend.l2_adapters.types import (
    L2AdapterListener,
    L2StoreResult,
    ObjectKey,
)
from lmcache.v1.storage_backend.put_tasks import PutTasks, PutTasksFull

logger = logging.getLogger(__name__)

DEFAULT_OP_TIMEOUT_S = 5.0
DEFAULT_POLL_INTERVAL_S = 0.05
DEFAULT_PUT_QUEUE_CHUNKS = 4096
DEFAULT_CLOSE_TIMEOUT_S = 10.0
READER_THREADS = 4


@dataclass(frozen=True)
class ChunkLayout:
    """What a buffer for a chunk read back must look like."""

    shapes: list[torch.Size]
    dtypes: list[torch.dtype]
    fmt: MemoryFormat
    used_size: int | None

    @classmethod
    def of(cls, obj: MemoryObj) -> ChunkLayout:
        return cls(
            list(obj.get_shapes()),
            list(obj.get_dtypes()),
            obj.get_memory_format(),
            obj.metadata.used_size,
        )


@dataclass
class _Entry:
    okey: ObjectKey
    layout: ChunkLayout
    size: int


@dataclass
class _StoreTask:
    keys: list[CacheEngineKey]
    okeys: list[ObjectKey]
    objs: list[MemoryObj]
    callback: Callable[[CacheEngineKey], None] | None
    future: Future = field(default_factory=Future)


class _IndexListener(L2AdapterListener):
    """Keeps the bridge's index in step with what the adapter reports."""

    def __init__(self, bridge: L2AdapterBackend) -> None:
        self._bridge = bridge

    def on_l2_keys_stored(self, keys: list[ObjectKey], sizes: list[int]) -> None:
        pass  # the store task's result adds keys (it carries their layouts)

    def on_l2_keys_accessed(self, keys: list[ObjectKey]) -> None:
        self._bridge._touch(keys)

    def on_l2_keys_deleted(self, keys: list[ObjectKey]) -> None:
        self._bridge._forget_okeys(keys)


class L2AdapterBackend(StorageBackendInterface):
    """A storage tier driving one L2 adapter (see the module doc)."""

    queues_own_puts = True

    def __init__(
        self,
        adapter: L2AdapterInterface,
        name: str,
        local_cpu_backend: AllocatorBackendInterface | None,
        dst_device: str = "cpu",
        op_timeout_s: float = DEFAULT_OP_TIMEOUT_S,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        put_queue_chunks: int = DEFAULT_PUT_QUEUE_CHUNKS,
        close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
        eviction: L2EvictionSpec | None = None,
    ) -> None:
        super().__init__(dst_device=dst_device)
        if op_timeout_s <= 0 or poll_interval_s <= 0:
            raise ValueError("op_timeout_s and poll_interval_s must be positive")
        self.eviction = check_bridge_eviction(eviction, name)
        if self.eviction is not None and not adapter.supports_global_eviction:
            logger.warning(
                'L2 adapter %s declares no capacity: its "eviction" never triggers', name
            )
        self.adapter = adapter
        self.name = name
        self.local_cpu_backend = local_cpu_backend
        self.op_timeout_s = op_timeout_s
        self._poll_interval_s = poll_interval_s
        self._close_timeout_s = close_timeout_s
        self._lock = threading.Lock()  # the index, pins and counters
        # The task tables (stores, lookups, loads, early store results, open reads).  Never
        # held while calling into the adapter (a submit may block) and never taken by the
        # listener (an adapter may notify from inside a call).
        self._tasks_lock = threading.Lock()
        # Store tasks go to the adapter from a thread of their own: an adapter whose
        # submit blocks (against its contract) must not hold up the caller's put.
        self._to_submit: queue.SimpleQueue[_StoreTask | None] = queue.SimpleQueue()
        self._early_stores: dict[L2TaskId, L2StoreResult] = {}
        self._reads: set[Future] = set()  # lookup and load futures not answered yet
        # Lookup and load tasks are submitted from here for the same reason; a caller
        # waits at most op_timeout_s whatever the adapter's submit does.
        self._readers = ThreadPoolExecutor(
            max_workers=READER_THREADS, thread_name_prefix=f"lmc-l2-read-{name}"
        )
        self._index: OrderedDict[CacheEngineKey, _Entry] = OrderedDict()
        self._by_okey: dict[ObjectKey, CacheEngineKey] = {}
        self._pins: dict[CacheEngineKey, int] = {}
        self._puts: PutTasks[CacheEngineKey] = PutTasks(limit=put_queue_chunks)
        self._stores: dict[L2TaskId, _StoreTask] = {}
        self._lookups: dict[L2TaskId, Future] = {}
        self._loads: dict[L2TaskId, Future] = {}
        self._log = RateLimitedLog(logger)
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "puts",
                "puts_failed",
                "puts_refused",
                "hits",
                "misses",
                "errors",
                "timeouts",
                "evictions",
            ),
            0,
        )
        self._closed = threading.Event()
        adapter.register_listener(_IndexListener(self))
        self._thread = threading.Thread(
            target=self._complete_forever, name=f"lmc-l2-{name}", daemon=True
        )
        self._thread.start()
        self._submitter = threading.Thread(
            target=self._submit_forever, name=f"lmc-l2-submit-{name}", daemon=True
        )
        self._submitter.start()

    def __str__(self) -> str:
        return f"L2AdapterBackend({self.name}: {type(self.adapter).__name__})"

    # -- bookkeeping ----------------------------------------------------------------------

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self.stats[name] += delta

    def _problem(
        self, kind: str, msg: str, *args: object, exc: BaseException | None = None
    ) -> None:
        self._log.log(logging.WARNING, kind, f"L2 adapter {self.name}: {msg}", *args, exc_info=exc)

    def _touch(self, okeys: list[ObjectKey]) -> None:
        with self._lock:
            for okey in okeys:
                key = self._by_okey.get(okey)
                if key is not None and key in self._index:
                    self._index.move_to_end(key)

    def _forget_okeys(self, okeys: list[ObjectKey]) -> None:
        with self._lock:
            for okey in okeys:
                key = self._by_okey.pop(okey, None)
                if key is not None:
                    self._index.pop(key, None)

    def _forget(self, keys: Sequence[CacheEngineKey]) -> None:
        with self._lock:
            for key in keys:
                entry = self._index.pop(key, None)
                if entry is not None:
                    self._by_okey.pop(entry.okey, None)

    def _entries(self, keys: Sequence[CacheEngineKey]) -> list[_Entry]:
        """The index entries of the leading ``keys`` that have one."""
        entries: list[_Entry] = []
        with self._lock:
            for key in keys:
                entry = self._index.get(key)
                if entry is None:
                    break
                entries.append(entry)
        return entries

    # -- completion thread ----------------------------------------------------------------

    def _event_fds(self) -> list[int]:
        fds: list[int] = []
        for getter in (
            self.adapter.get_store_event_fd,
            self.adapter.get_lookup_and_lock_event_fd,
            self.adapter.get_load_event_fd,
        ):
            try:
                fd = getter()
            except Exception as exc:
                self._problem("fd", "event fd unavailable (%s); polling instead", exc)
                continue
            if isinstance(fd, int) and fd >= 0 and fd not in fds:
                fds.append(fd)
        return fds

    def _complete_forever(self) -> None:
        poller = select.poll()
        fds = self._event_fds()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        while not self._closed.is_set():
            try:
                ready = poller.poll(self._poll_interval_s * 1000) if fds else []
                if not fds:
                    self._closed.wait(self._poll_interval_s)
                for fd, events in ready:
                    if events & _FD_GONE:
                        # Closed or broken under us: poll it no more (else every poll
                        # returns at once and this thread spins); results are still
                        # collected every poll interval.
                        self._problem("fd", "event fd %d is no longer valid; polling", fd)
                        poller.unregister(fd)
                        fds.remove(fd)
                        continue
                    _drain(fd)
                self._collect()
            except Exception as exc:  # the loop must outlive any adapter failure
                self._problem("completion", "completion polling failed: %s", exc, exc=exc)
                self._closed.wait(self._poll_interval_s)

    def _collect(self) -> None:
        with self._tasks_lock:
            lookups = list(self._lookups)
            loads = list(self._loads)
        for task_id, result in self.adapter.pop_completed_store_tasks().items():
            with self._tasks_lock:
                task = self._stores.pop(task_id, None)
                if task is None:  # finished before its submit returned
                    self._early_stores[task_id] = result
            if task is not None:
                self._finish_store(task, result)
        for task_id in lookups:
            self._resolve(self._lookups, task_id, self.adapter.query_lookup_and_lock_result)
        for task_id in loads:
            self._resolve(self._loads, task_id, self.adapter.query_load_result)

    def _resolve(
        self,
        table: dict[L2TaskId, Future],
        task_id: L2TaskId,
        query: Callable[[L2TaskId], Bitmap | None],
    ) -> None:
        try:
            bitmap = query(task_id)
        except Exception as exc:
            with self._tasks_lock:
                future = table.pop(task_id, None)
            if future is not None:
                future.set_exception(exc)
            return
        if bitmap is None:
            return
        with self._tasks_lock:
            future = table.pop(task_id, None)
        if future is not None:
            future.set_result(bitmap)

    # -- puts -----------------------------------------------------------------------------

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return key in self._puts

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future] | None:
        """Submit one store task for the keys not stored and not in flight; never blocks."""
        if len(keys) != len(objs):
            raise ValueError(f"{len(keys)} keys but {len(objs)} objects")
        with self._lock:
            batch = {k: o for k, o in zip(keys, objs) if k not in self._index}
        if not batch or self._closed.is_set():
            return []
        try:
            future = self._puts.start(
                list(batch), lambda fresh: self._submit_store(fresh, batch, on_complete_callback)
            )
        except PutTasksFull as full:
            self._count(puts_refused=full.keys)
            self._problem(
                "queue full", "%d chunks waiting to be stored; %d refused", full.limit, full.keys
            )
            return []
        return [] if future is None else [future]

    def _submit_store(
        self,
        fresh: list[CacheEngineKey],
        batch: dict[CacheEngineKey, MemoryObj],
        callback: Callable[[CacheEngineKey], None] | None,
    ) -> Future:
        """Queue the store of ``fresh`` for the submitter thread (runs under PutTasks'
        lock, so it only queues)."""
        objs = [batch[key] for key in fresh]
        task = _StoreTask(fresh, [object_key_of(k) for k in fresh], objs, callback)
        for obj in objs:
            obj.ref_count_up()  # the adapter reads them until the task finishes
        self._to_submit.put(task)
        return task.future

    def _submit_forever(self) -> None:
        while (task := self._to_submit.get()) is not None:
            try:
                task_id = self.adapter.submit_store_task(task.okeys, task.objs)
            except Exception as exc:
                self._problem("store", "store submit failed: %s", exc, exc=exc)
                self._drop_store(task)
                continue
            with self._tasks_lock:
                # The completion thread may have popped its result already.
                early = self._early_stores.pop(task_id, None)
                if early is None:
                    self._stores[task_id] = task
            if early is not None:
                self._finish_store(task, early)

    def _drop_store(self, task: _StoreTask) -> None:
        """A store that will not land: references, in-flight keys and its future go."""
        self._release(task.objs)
        self._count(puts_failed=len(task.keys))
        self._puts.finish(task.keys)
        task.future.set_result(None)

    def _finish_store(self, task: _StoreTask, result: L2StoreResult) -> None:
        with self._lock:
            if result.is_successful():
                for key, okey, obj in zip(task.keys, task.okeys, task.objs):
                    self._index[key] = _Entry(okey, ChunkLayout.of(obj), obj.get_size())
                    self._by_okey[okey] = key
        self._release(task.objs)
        self._puts.finish(task.keys)
        if result.is_successful():
            self._count(puts=len(task.keys))
            if task.callback is not None:
                for key in task.keys:
                    task.callback(key)
            self._evict_if_needed()
        else:
            self._count(puts_failed=len(task.keys))
            self._problem("store failed", "store of %d chunks failed", len(task.keys))
        task.future.set_result(None)

    def wait_for_puts(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout``, default the close timeout) for the stores in flight;
        False if some are still running."""
        deadline = time.monotonic() + (self._close_timeout_s if timeout is None else timeout)
        for future in self._puts.pending():
            try:
                future.exception(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                return False
        return True

    # -- adapter eviction -----------------------------------------------------------------

    def _evict_if_needed(self) -> None:
        """With an ``"eviction"`` (LRU), past ``trigger_watermark`` of the adapter's
        capacity: delete the least recently used unpinned keys, ``eviction_ratio`` of the
        capacity.  Runs on the completion thread, after a store landed."""
        spec = self.eviction
        if spec is None or spec.eviction_policy != "LRU":
            return
        try:
            usage = self.adapter.get_usage()
        except Exception as exc:
            self._problem("usage", "get_usage failed: %s", exc, exc=exc)
            return
        if usage.total_capacity_bytes <= 0 or usage.usage_fraction < spec.trigger_watermark:
            return
        goal = int(spec.eviction_ratio * usage.total_capacity_bytes)
        victims: list[CacheEngineKey] = []
        freed = 0
        with self._lock:
            for key, entry in self._index.items():  # oldest first
                if freed >= goal:
                    break
                if self._pins.get(key):
                    continue
                victims.append(key)
                freed += entry.size
            okeys = [self._index[k].okey for k in victims]
        if not victims:
            return
        self._forget(victims)
        self._count(evictions=len(victims))
        try:
            self.adapter.delete(okeys)
        except Exception as exc:
            self._problem("delete", "eviction delete failed: %s", exc, exc=exc)

    # -- lookups --------------------------------------------------------------------------

    def _submit_read(self, table: dict[L2TaskId, Future], submit: Callable[[], L2TaskId]) -> Future:
        """A future for the result of a lookup or load task that a reader thread submits,
        so a caller's wait stays bounded even if the adapter's submit blocks."""
        future: Future = Future()
        with self._tasks_lock:
            self._reads.add(future)
        future.add_done_callback(self._read_done)

        def run() -> None:
            try:
                task_id = submit()
            except Exception as exc:
                with contextlib.suppress(InvalidStateError):  # cancelled at close
                    future.set_exception(exc)
                return
            with self._tasks_lock:
                if not future.done():
                    table[task_id] = future

        try:
            self._readers.submit(run)
        except RuntimeError as exc:  # shut down: the tier is closing
            future.set_exception(exc)
        return future

    def _read_done(self, future: Future) -> None:
        with self._tasks_lock:
            self._reads.discard(future)

    def _lookup(self, okeys: list[ObjectKey]) -> Bitmap | None:
        """The adapter's found-bitmap (its hits locked), or None on error or timeout."""
        future = self._submit_read(
            self._lookups, lambda: self.adapter.submit_lookup_and_lock_task(okeys, {})
        )
        try:
            return future.result(timeout=self.op_timeout_s)  # type: ignore[no-any-return]
        except FutureTimeout:
            self._count(timeouts=1)
            self._problem("lookup timeout", "lookup of %d keys timed out", len(okeys))
            # Whatever it locks when it does answer is nobody's: let it go.
            future.add_done_callback(lambda f: self._unlock_found(okeys, f))
        except Exception as exc:
            self._count(errors=1)
            self._problem("lookup error", "lookup failed: %s", exc, exc=exc)
        return None

    def _unlock_found(self, okeys: list[ObjectKey], future: Future) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        found = [okeys[i] for i in future.result().get_indices_list() if i < len(okeys)]
        self._unlock(found)

    def _unlock(self, okeys: list[ObjectKey]) -> None:
        if not okeys:
            return
        try:
            self.adapter.submit_unlock(okeys)
        except Exception as exc:
            self._problem("unlock", "unlock failed: %s", exc, exc=exc)

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        """Leading ``keys`` the adapter has (one lookup task); with ``pin`` their locks are
        kept until :meth:`unpin`, every other lock is released at once."""
        entries = self._entries(keys)
        if not entries or self._closed.is_set():
            return 0
        okeys = [e.okey for e in entries]
        found = self._lookup(okeys)
        if found is None:
            return 0
        hits = min(found.count_leading_ones(), len(okeys))
        self._forget([keys[i] for i in range(len(okeys)) if not found.test(i)])
        keep = hits if pin else 0
        if keep:
            with self._lock:
                for key in keys[:keep]:
                    self._pins[key] = self._pins.get(key, 0) + 1
        self._unlock([okeys[i] for i in found.get_indices_list() if keep <= i < len(okeys)])
        return hits

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        return self.batched_contains([key], pin=pin) == 1

    # -- reads ----------------------------------------------------------------------------

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        return self.batched_get_blocking([key])[0]

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        """One load task for the keys the bridge stored; buffers come from L1's allocator."""
        results: list[MemoryObj | None] = [None] * len(keys)
        if self._closed.is_set():
            return results
        positions, okeys, buffers = self._buffers_for(keys)
        if not buffers:
            self._count(misses=len(keys))
            return results
        loaded = self._load(okeys, buffers)
        for position, obj, ok in zip(positions, buffers, loaded):
            if ok:
                results[position] = obj
            else:
                obj.ref_count_down()
        self._touch([okey for okey, ok in zip(okeys, loaded) if ok])  # recency for eviction
        hits = sum(ok for ok in loaded)
        self._count(hits=hits, misses=len(keys) - hits)
        return results

    def _buffers_for(
        self, keys: list[CacheEngineKey]
    ) -> tuple[list[int], list[ObjectKey], list[MemoryObj]]:
        with self._lock:
            entries = [(i, self._index.get(key)) for i, key in enumerate(keys)]
        positions: list[int] = []
        okeys: list[ObjectKey] = []
        buffers: list[MemoryObj] = []
        for i, entry in entries:
            if entry is None:
                continue
            layout = entry.layout
            obj = allocate_for_read(
                self.local_cpu_backend, layout.shapes, layout.dtypes, layout.fmt
            )
            if obj is None:
                self._problem("no memory", "no L1 memory to read a chunk into; a miss")
                continue
            if layout.used_size is not None:
                obj.set_used_size(layout.used_size)
            positions.append(i)
            okeys.append(entry.okey)
            buffers.append(obj)
        return positions, okeys, buffers

    def _load(self, okeys: list[ObjectKey], buffers: list[MemoryObj]) -> list[bool]:
        """Per buffer, whether the adapter filled it.  On a timeout the buffers stay the
        adapter's until it answers (they get a reference of their own, dropped then)."""
        future = self._submit_read(
            self._loads, lambda: self.adapter.submit_load_task(okeys, buffers)
        )
        try:
            bitmap: Bitmap = future.result(timeout=self.op_timeout_s)
        except FutureTimeout:
            self._count(timeouts=1)
            self._problem("load timeout", "load of %d chunks timed out; misses", len(okeys))
            for obj in buffers:
                obj.ref_count_up()  # kept from reuse until the adapter is done writing
            future.add_done_callback(lambda _f: self._release(buffers))
            return [False] * len(buffers)
        except Exception as exc:
            self._count(errors=1)
            self._problem("load error", "load failed: %s; misses", exc, exc=exc)
            return [False] * len(buffers)
        loaded = [bitmap.test(i) for i in range(len(buffers))]
        if not all(loaded):
            self._problem(
                "load miss",
                "%d of %d chunks failed to load; misses",
                loaded.count(False),
                len(loaded),
            )
        return loaded

    @staticmethod
    def _release(objs: list[MemoryObj]) -> None:
        for obj in objs:
            obj.ref_count_down()

    # -- pins and removal -----------------------------------------------------------------

    def pin(self, key: CacheEngineKey) -> bool:
        return self.contains(key, pin=True)

    def unpin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            count = self._pins.get(key, 0)
            if count == 0:
                return False
            if count == 1:
                del self._pins[key]
            else:
                self._pins[key] = count - 1
        self._unlock([object_key_of(key)])
        return True

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        return self.batched_remove([key], force=force) == 1

    def batched_remove(self, keys: list[CacheEngineKey], force: bool = True) -> int:
        """Forget ``keys`` and ask the adapter to delete them (pinned ones only with
        ``force``; their locks are released)."""
        with self._lock:
            chosen = [k for k in keys if k in self._index and (force or not self._pins.get(k))]
            okeys = [self._index[k].okey for k in chosen]
            held = [self._index[k].okey for k in chosen for _ in range(self._pins.pop(k, 0))]
        self._forget(chosen)
        self._unlock(held)
        if okeys:
            try:
                self.adapter.delete(okeys)
            except Exception as exc:
                self._problem("delete", "delete failed: %s", exc, exc=exc)
        return len(chosen)

    # -- misc -----------------------------------------------------------------------------

    def get_allocator_backend(self) -> AllocatorBackendInterface:
        if self.local_cpu_backend is None:
            raise RuntimeError(f"{self} was built without a LocalCPUBackend")
        return self.local_cpu_backend

    @property
    def used_bytes(self) -> int:
        """The adapter's counted bytes (``get_usage``; 0 if it cannot say)."""
        try:
            return int(self.adapter.get_usage().total_bytes_used)
        except Exception:
            return 0

    @property
    def capacity_bytes(self) -> int | None:
        """The adapter's declared capacity, or None when it declares none."""
        try:
            capacity = int(self.adapter.get_usage().total_capacity_bytes)
        except Exception:
            return None
        return capacity if capacity > 0 else None

    @property
    def evictions(self) -> int:
        """Keys this tier deleted from the adapter to make room (its ``"eviction"``)."""
        with self._lock:
            return self.stats["evictions"]

    def get_stats(self) -> dict[str, int]:
        """Hits, misses and errors (failed or timed-out adapter calls, failed stores), as
        the server reports for a remote tier, with the rest of the counters."""
        with self._lock:
            stats = dict(self.stats)
        stats["errors"] = stats["errors"] + stats["timeouts"] + stats["puts_failed"]
        return stats

    def health_degraded(self) -> list[str]:
        """Why the tier serves degraded: the adapter reports itself unhealthy (the server
        keeps serving; its reads through this tier may miss)."""
        status = self.report_status()
        if status.get("is_healthy", True):
            return []
        detail = status.get("error") or status.get("reason") or "no reason given"
        return [f"the adapter reports itself unhealthy ({detail})"]

    def __len__(self) -> int:
        """Keys stored through this bridge that it still believes present."""
        with self._lock:
            return len(self._index)

    def report_status(self) -> dict[str, Any]:
        """The adapter's status with the bridge's counters and index size."""
        try:
            status = dict(self.adapter.report_status())
        except Exception as exc:
            status = {"is_healthy": False, "error": f"{type(exc).__name__}: {exc}"}
        with self._lock:
            status["bridge"] = {**self.stats, "indexed_keys": len(self._index)}
        return status

    def close(self) -> None:
        """Wait (bounded) for stores in flight, stop polling, close the adapter, then drop
        the references of tasks it never finished (it can no longer touch them)."""
        if self._closed.is_set():
            return
        if not self.wait_for_puts():
            self._problem("close", "closing with stores still in flight")
        self._closed.set()
        self._readers.shutdown(wait=False, cancel_futures=True)
        self._to_submit.put(None)
        self._submitter.join(timeout=self._close_timeout_s)
        self._thread.join(timeout=self._close_timeout_s)
        try:
            self.adapter.close()
        except Exception as exc:
            self._problem("close", "adapter close failed: %s", exc, exc=exc)
        while True:  # queued but never submitted (the submitter stopped first)
            try:
                queued = self._to_submit.get_nowait()
            except queue.Empty:
                break
            if queued is not None:
                self._release(queued.objs)
                self._puts.finish(queued.keys)
                queued.future.set_result(None)
        with self._tasks_lock:
            stores, self._stores = list(self._stores.values()), {}
            waiting = list(self._reads)  # submitted or not: each may hold buffers
            self._lookups, self._loads = {}, {}
        for task in stores:
            self._release(task.objs)
            self._puts.finish(task.keys)
            task.future.set_result(None)
        for future in waiting:
            future.cancel()  # runs the release callbacks of timed-out loads


_FD_GONE = select.POLLNVAL | select.POLLERR | select.POLLHUP

BRIDGE_EVICTION_POLICIES = ("LRU", "noop")
"""The ``"eviction"`` policies an adapter tier acts on (ARC and IsolatedLRU not yet)."""


def check_bridge_eviction(spec: L2EvictionSpec | None, name: str) -> L2EvictionSpec | None:
    """``spec`` if this tier can honour it; ``ValueError`` naming what it can do otherwise."""
    if spec is None:
        return None
    if spec.eviction_policy not in BRIDGE_EVICTION_POLICIES:
        raise ValueError(
            f"{name}: eviction_policy {spec.eviction_policy!r} is not available on L2 adapter "
            f"tiers yet; use one of {', '.join(BRIDGE_EVICTION_POLICIES)}"
        )
    if not 0 < spec.trigger_watermark <= 1 or not 0 < spec.eviction_ratio <= 1:
        raise ValueError(
            f"{name}: eviction trigger_watermark and eviction_ratio must be in (0, 1], got "
            f"{spec.trigger_watermark} and {spec.eviction_ratio}"
        )
    return spec


def _drain(fd: int) -> None:
    from lmcache.v1.platform.notifiers import consume_fd

    try:
        consume_fd(fd)
    except OSError:
        pass  # closed under us at shutdown; the loop ends with the next check
