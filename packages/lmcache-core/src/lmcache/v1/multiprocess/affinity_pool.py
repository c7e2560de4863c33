"""A thread pool that runs every task of one *affinity key* on the same worker thread.

This is upstream LMCache 0.5.6's ``lmcache.v1.multiprocess.affinity_pool`` API
(:class:`AffinityThreadPool`), implemented for this package; the MP server's transport
uses it for its ordered (store/retrieve-family) operations, keyed by the client identity.

* Keys are bound to worker slots on first use, in arrival order: the first
  ``max_workers`` distinct keys each get a thread of their own, whatever their values
  (a ``hash(key) % n`` scheme would let two keys share a thread while another idles).
  Later keys wrap around onto earlier slots (warned about once).
* A binding never changes, so one key's tasks run one after another in submission order.
  With ``release_idle_keys=True`` (the MP server's choice) a key is unbound as soon as it
  has no queued or running task, and a new binding goes to the slot with the fewest bound
  keys: order per key still holds (a key with pending work keeps its slot), and the table
  holds only keys with work in flight, so a long-lived server whose clients reconnect
  under fresh identities does not grow it without bound.
* :meth:`AffinityThreadPool.submit` returns a :class:`concurrent.futures.Future`; after
  :meth:`~AffinityThreadPool.shutdown` it raises ``RuntimeError`` as
  :class:`~concurrent.futures.ThreadPoolExecutor` does, and tasks queued before the
  shutdown still run.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

logger = logging.getLogger(__name__)

# One queued task: the future to settle, then the call to make.
_Task = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]
# ``shutdown`` puts one ``None`` (the stop marker) on every worker queue; a worker exits
# when it reaches it, so everything queued before it still runs.


class AffinityThreadPool:
    """``max_workers`` single-thread queues; a key always lands on the one it was bound to.

    ``submit`` is safe to call from several threads (binding is under a lock), though the
    MP transports submit from one thread.
    """

    def __init__(
        self,
        max_workers: int,
        thread_name_prefix: str = "affinity",
        *,
        release_idle_keys: bool = False,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self._prefix = thread_name_prefix
        self._queues: list[queue.SimpleQueue[_Task | None]] = [
            queue.SimpleQueue() for _ in range(max_workers)
        ]
        self._slots: dict[Hashable, int] = {}
        self._release_idle_keys = release_idle_keys
        # Per key: tasks submitted and not yet finished (tracked only when releasing).
        self._pending: dict[Hashable, int] = {}
        # Per slot: keys bound to it now.
        self._slot_load = [0] * max_workers
        self._lock = threading.Lock()
        self._shut_down = False
        self._warned_overflow = False
        self._threads = [
            threading.Thread(
                target=self._run_worker,
                args=(q,),
                name=f"{thread_name_prefix}-{index}",
                daemon=True,
            )
            for index, q in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()
        logger.info(
            "AffinityThreadPool %r: %d worker thread(s); the first %d distinct affinity "
            "keys get a thread each, later keys share one",
            thread_name_prefix,
            max_workers,
            max_workers,
        )

    @property
    def max_workers(self) -> int:
        return len(self._queues)

    @property
    def bound_keys(self) -> int:
        """How many keys are bound to a slot now."""
        with self._lock:
            return len(self._slots)

    @staticmethod
    def _run_worker(tasks: queue.SimpleQueue[_Task | None]) -> None:
        while (task := tasks.get()) is not None:
            future, fn, args, kwargs = task
            # False when the caller cancelled the future while it was queued.
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # the caller sees it through the future
                future.set_exception(exc)
            else:
                future.set_result(result)
            # Drop the references now, not when the next task arrives.
            del task, future, fn, args, kwargs

    def slot_for(self, affinity_key: Hashable) -> int:
        """The worker slot ``affinity_key`` is bound to, binding it on first use (with
        ``release_idle_keys`` an idle key is not bound: the answer is the slot it would
        get now)."""
        with self._lock:
            if self._release_idle_keys and affinity_key not in self._slots:
                return self._least_loaded_slot()
            return self._bind(affinity_key)

    def _least_loaded_slot(self) -> int:
        # Lowest index first: with no releases this is arrival order, wrapping
        # round-robin once every slot has a key.
        return min(range(len(self._queues)), key=self._slot_load.__getitem__)

    def _bind(self, affinity_key: Hashable) -> int:
        slot = self._slots.get(affinity_key)
        if slot is not None:
            return slot
        slot = self._least_loaded_slot()
        shared = self._slot_load[slot] > 0
        self._slots[affinity_key] = slot
        self._slot_load[slot] += 1
        logger.debug(
            "AffinityThreadPool %r: affinity_key=%r bound to worker slot %d of %d (%s)",
            self._prefix,
            affinity_key,
            slot,
            len(self._queues),
            self._threads[slot].name,
        )
        if shared and not self._warned_overflow:
            self._warned_overflow = True
            logger.warning(
                "AffinityThreadPool %r: affinity_key=%r wrapped onto worker slot %d: more "
                "distinct keys than the %d workers, so its tasks are serialized with an "
                "earlier key's; raise the worker count to give every client its own thread",
                self._prefix,
                affinity_key,
                slot,
                len(self._queues),
            )
        return slot

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, affinity_key: Hashable = 0, **kwargs: Any
    ) -> Future[Any]:
        """Queue ``fn(*args, **kwargs)`` on the worker bound to ``affinity_key``."""
        future: Future[Any] = Future()
        with self._lock:
            if self._shut_down:
                raise RuntimeError("cannot schedule new futures after shutdown")
            slot = self._bind(affinity_key)
            if self._release_idle_keys:
                self._pending[affinity_key] = self._pending.get(affinity_key, 0) + 1
                future.add_done_callback(lambda _f: self._task_finished(affinity_key))
            # Enqueued under the lock so no task can land behind a worker's stop marker.
            self._queues[slot].put((future, fn, args, kwargs))
        return future

    def _task_finished(self, affinity_key: Hashable) -> None:
        """Unbind ``affinity_key`` once its last pending task is done (or cancelled)."""
        with self._lock:
            left = self._pending[affinity_key] - 1
            if left:
                self._pending[affinity_key] = left
                return
            del self._pending[affinity_key]
            self._slot_load[self._slots.pop(affinity_key)] -= 1

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting tasks; workers finish what is queued, then exit.

        With ``wait`` the call returns once every worker has exited. Calling it again is
        harmless.
        """
        with self._lock:
            if not self._shut_down:
                self._shut_down = True
                for tasks in self._queues:
                    tasks.put(None)
        if wait:
            current = threading.current_thread()
            for thread in self._threads:
                # A task that shuts its own pool down must not join itself.
                if thread is not current:
                    thread.join()
