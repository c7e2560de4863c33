"""Upstream's ``AsyncSerdeProcessor``: a sync serializer/deserializer pair on a thread
pool, each finished batch signalled on an event fd (one for serialize, one for
deserialize) and its result kept until queried once."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lmcache.compat.upstream_056.distributed.serde.base import SerdeProcessor, SerdeTaskId
from lmcache.v1.storage_backend.serde.base import Deserializer, Serializer

logger = logging.getLogger(__name__)


class AsyncSerdeProcessor(SerdeProcessor):
    """``serializer`` / ``deserializer`` run on ``max_workers`` threads."""

    def __init__(
        self, serializer: Serializer, deserializer: Deserializer, max_workers: int = 1
    ) -> None:
        # The platform's notifiers (eventfd, or a pipe where there is none).
        from lmcache.v1.platform import create_event_notifier

        self._serializer = serializer
        self._deserializer = deserializer
        self._serialize_efd = create_event_notifier()
        self._deserialize_efd = create_event_notifier()
        self._lock = threading.Lock()
        self._next_id: SerdeTaskId = 0
        self._serialized: dict[SerdeTaskId, bool] = {}
        self._deserialized: dict[SerdeTaskId, bool] = {}
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="lmc-serde")

    def get_serialize_event_fd(self) -> int:
        return int(self._serialize_efd.fileno())

    def get_deserialize_event_fd(self) -> int:
        return int(self._deserialize_efd.fileno())

    def _task_id(self) -> SerdeTaskId:
        with self._lock:
            task_id = self._next_id
            self._next_id += 1
        return task_id

    def submit_serialize(
        self, src_objs: list[Any], dst_objs: list[Any], keys: list[Any]
    ) -> SerdeTaskId:
        task_id = self._task_id()
        self._pool.submit(self._run, task_id, True, src_objs, dst_objs, keys)
        return task_id

    def submit_deserialize(
        self, src_objs: list[Any], dst_objs: list[Any], keys: list[Any]
    ) -> SerdeTaskId:
        task_id = self._task_id()
        self._pool.submit(self._run, task_id, False, src_objs, dst_objs, keys)
        return task_id

    def query_serialize_result(self, task_id: SerdeTaskId) -> bool | None:
        with self._lock:
            return self._serialized.pop(task_id, None)

    def query_deserialize_result(self, task_id: SerdeTaskId) -> bool | None:
        with self._lock:
            return self._deserialized.pop(task_id, None)

    def estimate_serialized_size(self, layout_desc: Any) -> int:
        return self._serializer.estimate_serialized_size(layout_desc)

    def _run(
        self,
        task_id: SerdeTaskId,
        serialize: bool,
        src_objs: list[Any],
        dst_objs: list[Any],
        keys: list[Any],
    ) -> None:
        ok = True
        try:
            for src, dst, key in zip(src_objs, dst_objs, keys, strict=True):
                if serialize:
                    written = self._serializer.serialize(src, dst, key)
                    # dst was sized by the estimate (an upper bound): narrow it to what was
                    # written, so a tier storing it stores exactly that.
                    if isinstance(written, int) and hasattr(dst, "set_used_size"):
                        dst.set_used_size(written)
                else:
                    self._deserializer.deserialize(src, dst, key)
        except Exception:
            logger.exception("serde task %d failed", task_id)
            ok = False
        with self._lock:
            (self._serialized if serialize else self._deserialized)[task_id] = ok
        (self._serialize_efd if serialize else self._deserialize_efd).notify()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._serialize_efd.close()
        self._deserialize_efd.close()


__all__ = ["AsyncSerdeProcessor"]
