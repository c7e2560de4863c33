"""The L2 adapter interface: third-party storage written against upstream LMCache 0.5.6.

An L2 adapter moves chunks between memory objects its caller owns and some storage, with
non-blocking primitives: the caller *submits* a store, a lookup-and-lock or a load task
and gets an :data:`L2TaskId`; the adapter signals a finished task by making one of its
three event descriptors readable; the caller then pops finished stores
(:meth:`~L2AdapterInterface.pop_completed_store_tasks`) or asks for one lookup's or load's
:class:`~lmcache.v1.storage_backend.l2_adapters.bitmap.Bitmap` (a bit per key, set = found
/ loaded; answered once per task).  Store errors are reported per task, lookup and load
results per key.  Adapters must be thread-safe (a store thread and a reader drive them).

This server runs any adapter as a storage tier through
:class:`~lmcache.v1.storage_backend.l2_adapters.bridge.L2AdapterBackend`; upstream's path
``lmcache.v1.distributed.l2_adapters.base`` is this module.

Byte accounting lives here: an adapter passes the size of each key to
:meth:`~L2AdapterInterface._notify_keys_stored` / ``_notify_keys_deleted`` and
:meth:`~L2AdapterInterface.get_usage` reports the totals, overall and per ``cache_salt``.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmcache.v1.memory.base import MemoryObj
    from lmcache.v1.storage_backend.l2_adapters.bitmap import Bitmap
    from lmcache.v1.storage_backend.l2_adapters.types import (
        KeyListPage,
        L2AdapterListener,
        L2StoreResult,
        MemoryLayoutDesc,
        ObjectKey,
    )

logger = logging.getLogger(__name__)

L2TaskId = int

_NO_SALTS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True)
class AdapterUsage:
    """An immutable snapshot of an adapter's bytes, in total and per ``cache_salt``.

    ``total_capacity_bytes`` 0 means unknown or unbounded (no global eviction signal);
    ``bytes_by_cache_salt`` holds only salts with bytes and is read-only.
    """

    total_bytes_used: int
    total_capacity_bytes: int
    bytes_by_cache_salt: Mapping[str, int] = field(default_factory=lambda: _NO_SALTS)

    @property
    def usage_fraction(self) -> float:
        """Used / capacity, or -1.0 when the capacity is unknown (upstream's sentinel)."""
        if self.total_capacity_bytes <= 0:
            return -1.0
        return self.total_bytes_used / self.total_capacity_bytes


def _bytes_per_salt(keys: list[ObjectKey], sizes: list[int]) -> tuple[int, dict[str, int]]:
    """(total, per-salt) of a batch; one dict update per salt, not per key (large batches)."""
    per_salt: dict[str, int] = {}
    total = 0
    for key, size in zip(keys, sizes, strict=True):
        per_salt[key.cache_salt] = per_salt.get(key.cache_salt, 0) + size
        total += size
    return total, per_salt


class L2AdapterInterface(abc.ABC):
    """Non-blocking store / lookup-and-lock / load of chunks in some storage.

    The three ``get_*_event_fd`` descriptors must be distinct (a driver maps each fd back
    to its adapter and operation).  The adapter never owns the memory objects it is given:
    the caller keeps them valid until the task finishes.
    """

    def __init__(self, max_capacity_bytes: int = 0) -> None:
        """``max_capacity_bytes`` 0: no aggregate capacity, so no global eviction."""
        self._listeners: list[L2AdapterListener] = []
        self._backend_name = ""
        self._shared = False
        self._max_capacity_bytes = max_capacity_bytes
        self._total_bytes_used = 0
        self._bytes_by_cache_salt: dict[str, int] = {}
        self._usage_lock = threading.Lock()

    # -- event descriptors ----------------------------------------------------------------

    @abc.abstractmethod
    def get_store_event_fd(self) -> int:
        """Readable when a store task finished."""

    @abc.abstractmethod
    def get_lookup_and_lock_event_fd(self) -> int:
        """Readable when a lookup-and-lock task finished."""

    @abc.abstractmethod
    def get_load_event_fd(self) -> int:
        """Readable when a load task finished."""

    # -- store ----------------------------------------------------------------------------

    @abc.abstractmethod
    def submit_store_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        """Store ``objects[i]`` under ``keys[i]``; the objects stay valid until it finishes."""

    @abc.abstractmethod
    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        """Every store task finished since the last call, with its result."""

    # -- lookup and lock ------------------------------------------------------------------

    @abc.abstractmethod
    def submit_lookup_and_lock_task(
        self, keys: list[ObjectKey], group_layout_descs: dict[int, MemoryLayoutDesc]
    ) -> L2TaskId:
        """Look ``keys`` up and lock the ones found against eviction until
        :meth:`submit_unlock`.  ``group_layout_descs`` (object group -> layout) is a hint
        most adapters ignore."""

    @abc.abstractmethod
    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        """The found-bitmap of a finished lookup (once per task), or None while running."""

    @abc.abstractmethod
    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        """Release one lock of each of ``keys``; must eventually succeed (never retried)."""

    # -- load -----------------------------------------------------------------------------

    @abc.abstractmethod
    def submit_load_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        """Copy the data of ``keys[i]`` into ``objects[i]`` (buffers the caller owns)."""

    @abc.abstractmethod
    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        """The loaded-bitmap of a finished load (once per task), or None while running."""

    # -- listeners and identity -----------------------------------------------------------

    def register_listener(self, listener: L2AdapterListener) -> None:
        """Tell ``listener`` about every key stored, accessed or deleted from now on."""
        self._listeners.append(listener)

    def set_backend_identity(self, name: str, shared: bool = False) -> None:
        """The adapter type name (non-empty) and whether it mounts a fleet-shared pool."""
        if not name:
            raise ValueError("backend name must be non-empty")
        self._backend_name = name
        self._shared = shared

    def _notify_keys_stored(self, keys: list[ObjectKey], sizes: list[int]) -> None:
        """Count ``sizes`` (a size 0 re-store only notifies) and tell the listeners."""
        total, per_salt = _bytes_per_salt(keys, sizes)
        with self._usage_lock:
            self._total_bytes_used += total
            for salt, delta in per_salt.items():
                self._bytes_by_cache_salt[salt] = self._bytes_by_cache_salt.get(salt, 0) + delta
        # Outside the lock: a slow listener must not stall the next notification.
        for listener in self._listeners:
            listener.on_l2_keys_stored(keys, sizes)

    def _notify_keys_accessed(self, keys: list[ObjectKey]) -> None:
        """Tell the listeners ``keys`` were served (no byte change)."""
        for listener in self._listeners:
            listener.on_l2_keys_accessed(keys)

    def _notify_keys_deleted(self, keys: list[ObjectKey], sizes: list[int]) -> None:
        """Uncount ``sizes`` and tell the listeners.  A salt at zero is dropped; a total
        that would go negative (an adapter's double delete) is clamped to 0 and logged,
        because a negative total would read as "unknown" and switch eviction off."""
        total, per_salt = _bytes_per_salt(keys, sizes)
        with self._usage_lock:
            self._total_bytes_used -= total
            if self._total_bytes_used < 0:
                logger.warning(
                    "L2 adapter byte accounting fell to %d after deleting %d keys (%d bytes); "
                    "clamped to 0 (the adapter deleted a key twice or with another size)",
                    self._total_bytes_used,
                    len(keys),
                    total,
                )
                self._total_bytes_used = 0
            for salt, delta in per_salt.items():
                left = self._bytes_by_cache_salt.get(salt, 0) - delta
                if left <= 0:
                    self._bytes_by_cache_salt.pop(salt, None)
                else:
                    self._bytes_by_cache_salt[salt] = left
        for listener in self._listeners:
            listener.on_l2_keys_deleted(keys)

    # -- eviction, listing, usage ---------------------------------------------------------

    @property
    def supports_global_eviction(self) -> bool:
        """Whether the adapter declared a capacity (so usage-driven eviction applies)."""
        return self._max_capacity_bytes > 0

    def delete(self, keys: list[ObjectKey]) -> None:  # noqa: B027 - optional, upstream's no-op
        """Delete ``keys`` (and notify the listeners); a no-op unless the adapter evicts."""

    def list_l2_keys(
        self, model_name: str | None = None, page_size: int = 500, cursor: str | None = None
    ) -> KeyListPage:
        """One page of the stored keys (of ``model_name`` if given); optional."""
        raise NotImplementedError(f"{type(self).__name__} does not implement list_l2_keys")

    def get_usage(self) -> AdapterUsage:
        """A fresh snapshot of the counted bytes."""
        with self._usage_lock:
            per_salt = {salt: n for salt, n in self._bytes_by_cache_salt.items() if n > 0}
            return AdapterUsage(
                total_bytes_used=self._total_bytes_used,
                total_capacity_bytes=self._max_capacity_bytes,
                bytes_by_cache_salt=MappingProxyType(per_salt),
            )

    # -- cleanup and status ---------------------------------------------------------------

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything (the event descriptors too); the adapter is unusable after."""

    def report_status(self) -> dict:
        """At least ``is_healthy``; adapters add their own fields."""
        return {
            "is_healthy": True,
            "extra_warning": "report_status is not implemented and runs default impl",
        }
