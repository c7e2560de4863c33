"""Upstream's ``lmcache.v1.distributed.serde.base``: its serde interfaces.

``Serializer``, ``Deserializer`` and ``SerdeConfig`` are the product's
(:mod:`lmcache.v1.storage_backend.serde.base`).  ``SerdeProcessor`` -- the asynchronous,
event-fd face upstream's storage controllers consume -- exists only for upstream's API:
lmcache-core's tiers run a serde on their own put threads
(:class:`~lmcache.v1.storage_backend.serde.SerdeBackend`).
"""

from __future__ import annotations

import abc
from typing import Any

from lmcache.v1.storage_backend.serde.base import Deserializer, SerdeConfig, Serializer

SerdeTaskId = int


class SerdeProcessor(abc.ABC):
    """Upstream's asynchronous serde: submit a batch, get an id, wait for its event fd
    (distinct fds for serialize and deserialize), then query the result once."""

    @abc.abstractmethod
    def get_serialize_event_fd(self) -> int: ...

    @abc.abstractmethod
    def get_deserialize_event_fd(self) -> int: ...

    @abc.abstractmethod
    def submit_serialize(
        self, src_objs: list[Any], dst_objs: list[Any], keys: list[Any]
    ) -> SerdeTaskId: ...

    @abc.abstractmethod
    def query_serialize_result(self, task_id: SerdeTaskId) -> bool | None:
        """True/False once done (then forgotten), None while pending."""

    @abc.abstractmethod
    def submit_deserialize(
        self, src_objs: list[Any], dst_objs: list[Any], keys: list[Any]
    ) -> SerdeTaskId: ...

    @abc.abstractmethod
    def query_deserialize_result(self, task_id: SerdeTaskId) -> bool | None: ...

    @abc.abstractmethod
    def estimate_serialized_size(self, layout_desc: Any) -> int: ...

    @abc.abstractmethod
    def close(self) -> None: ...


__all__ = ["Deserializer", "SerdeConfig", "SerdeProcessor", "SerdeTaskId", "Serializer"]
