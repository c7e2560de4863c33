"""An L2 adapter a third party wrote against upstream LMCache 0.5.6's interface.

It keeps each object's bytes in a dict, does its work on one background thread, and
signals completions through event fds -- the contract of ``L2AdapterInterface``.  With
``adapter_params["stats_path"]`` it writes its counters there as JSON after every task and
before it signals the task done, so a test can see from outside the server process that
reads went through it (a reply that needed the task comes after its count).
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import threading
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase
from lmcache.v1.platform import create_event_notifier


class BytesL2AdapterConfig(L2AdapterConfigBase):
    """Found by the plugin loader by name (``<class_name>Config``)."""

    def __init__(self, stats_path: str | None, max_objects: int) -> None:
        self.stats_path = stats_path
        self.max_objects = max_objects

    @classmethod
    def from_dict(cls, d: dict) -> BytesL2AdapterConfig:
        stats_path = d.get("stats_path")
        if stats_path is not None and not isinstance(stats_path, str):
            raise ValueError("stats_path must be a string")
        max_objects = d.get("max_objects", 100_000)
        if not isinstance(max_objects, int) or max_objects <= 0:
            raise ValueError("max_objects must be a positive integer")
        return cls(stats_path, max_objects)

    @classmethod
    def help(cls) -> str:
        return "- stats_path (str, optional)\n- max_objects (int, default 100000)"


class BytesL2Adapter(L2AdapterInterface):
    def __init__(self, config: BytesL2AdapterConfig) -> None:
        super().__init__(max_capacity_bytes=0)
        self._config = config
        self._data: dict[ObjectKey, bytes] = {}
        self._locks: dict[ObjectKey, int] = {}
        self._ids = itertools.count()
        self._mutex = threading.Lock()
        self._stores_done: dict[L2TaskId, L2StoreResult] = {}
        self._lookups_done: dict[L2TaskId, Bitmap] = {}
        self._loads_done: dict[L2TaskId, Bitmap] = {}
        self._stats = {"stored": 0, "lookups": 0, "loaded": 0, "load_misses": 0}
        self._store_fd = create_event_notifier()
        self._lookup_fd = create_event_notifier()
        self._load_fd = create_event_notifier()
        self._tasks: queue.Queue[Any] = queue.Queue()
        self._worker = threading.Thread(target=self._work, daemon=True)
        self._worker.start()

    def get_store_event_fd(self) -> int:
        return self._store_fd.fileno()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_fd.fileno()

    def get_load_event_fd(self) -> int:
        return self._load_fd.fileno()

    def submit_store_task(self, keys: list[ObjectKey], objects: list[Any]) -> L2TaskId:
        task_id = next(self._ids)
        self._tasks.put(("store", task_id, list(keys), list(objects)))
        return task_id

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._mutex:
            done, self._stores_done = self._stores_done, {}
        return done

    def submit_lookup_and_lock_task(
        self, keys: list[ObjectKey], group_layout_descs: dict[int, MemoryLayoutDesc]
    ) -> L2TaskId:
        task_id = next(self._ids)
        self._tasks.put(("lookup", task_id, list(keys), None))
        return task_id

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._mutex:
            return self._lookups_done.pop(task_id, None)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        self._tasks.put(("unlock", -1, list(keys), None))

    def submit_load_task(self, keys: list[ObjectKey], objects: list[Any]) -> L2TaskId:
        task_id = next(self._ids)
        self._tasks.put(("load", task_id, list(keys), list(objects)))
        return task_id

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._mutex:
            return self._loads_done.pop(task_id, None)

    def delete(self, keys: list[ObjectKey]) -> None:
        with self._mutex:
            gone = [(k, len(self._data.pop(k))) for k in keys if k in self._data]
        if gone:
            self._notify_keys_deleted([k for k, _ in gone], [n for _, n in gone])

    def close(self) -> None:
        self._tasks.put(None)
        self._worker.join(timeout=5)
        for fd in (self._store_fd, self._lookup_fd, self._load_fd):
            fd.close()

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            kind, task_id, keys, objects = task
            getattr(self, f"_do_{kind}")(task_id, keys, objects)

    def _do_store(self, task_id: L2TaskId, keys: list[ObjectKey], objects: list[Any]) -> None:
        stored, sizes = [], []
        for key, obj in zip(keys, objects):
            payload = bytes(obj.byte_array)
            with self._mutex:
                if key in self._data or len(self._data) >= self._config.max_objects:
                    continue
                self._data[key] = payload
                self._stats["stored"] += 1
            stored.append(key)
            sizes.append(len(payload))
        with self._mutex:
            self._stores_done[task_id] = L2StoreResult(True, sum(sizes))
        if stored:
            self._notify_keys_stored(stored, sizes)
        self._write_stats()  # before the signal: a reader that saw it sees the count
        self._store_fd.notify()

    def _do_lookup(self, task_id: L2TaskId, keys: list[ObjectKey], _objects: Any) -> None:
        found = Bitmap(len(keys))
        with self._mutex:
            self._stats["lookups"] += 1
            for i, key in enumerate(keys):
                if key in self._data:
                    found.set(i)
                    self._locks[key] = self._locks.get(key, 0) + 1
            self._lookups_done[task_id] = found
        self._write_stats()  # before the signal: a reader that saw it sees the count
        self._lookup_fd.notify()

    def _do_unlock(self, _task_id: L2TaskId, keys: list[ObjectKey], _objects: Any) -> None:
        with self._mutex:
            for key in keys:
                left = self._locks.get(key, 0) - 1
                if left > 0:
                    self._locks[key] = left
                else:
                    self._locks.pop(key, None)

    def _do_load(self, task_id: L2TaskId, keys: list[ObjectKey], objects: list[Any]) -> None:
        loaded = Bitmap(len(keys))
        hits = []
        for i, (key, obj) in enumerate(zip(keys, objects)):
            with self._mutex:
                payload = self._data.get(key)
            target = obj.byte_array
            if payload is None or len(payload) != len(target):
                with self._mutex:
                    self._stats["load_misses"] += 1
                continue
            target[:] = payload
            loaded.set(i)
            hits.append(key)
        with self._mutex:
            self._stats["loaded"] += len(hits)
            self._loads_done[task_id] = loaded
        if hits:
            self._notify_keys_accessed(hits)
        self._write_stats()  # before the signal: a reader that saw it sees the count
        self._load_fd.notify()

    def _write_stats(self) -> None:
        path = self._config.stats_path
        if not path:
            return
        with self._mutex:
            text = json.dumps(self._stats)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
