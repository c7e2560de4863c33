"""Prepared but uncommitted engine-driven transfers (``prepare_*`` -> ``commit_*``).

Each entry holds references to its L1 objects until its commit, its worker's
unregistration or its expiry releases them.  A peer can name any instance id or token
range, so the table is bounded (``MAX_PENDING_TRANSFERS``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.multiprocess.wire.protocol import ErrorCode, ProtocolError

MAX_PENDING_TRANSFERS = 65536

# (instance id, the chunk hashes of the request's spans)
PendingId = tuple[int, tuple[int, ...]]


@dataclasses.dataclass
class Pending:
    """One prepared transfer: its keys, the L1 objects it holds and the chunk indices."""

    keys: list[CacheEngineKey]
    objs: list[MemoryObj]
    indices: list[int]
    created: float = dataclasses.field(default_factory=time.monotonic)

    def release(self) -> None:
        for obj in self.objs:
            obj.ref_count_down()
        self.objs = []


class PendingTransfers:
    """The pending stores and retrieves, under one lock."""

    def __init__(self) -> None:
        self.stores: dict[PendingId, Pending] = {}
        self.retrieves: dict[PendingId, Pending] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self.stores) + len(self.retrieves)

    def put(self, table: dict[PendingId, Pending], ident: PendingId, pending: Pending) -> None:
        """Remember ``pending`` (replacing an earlier prepare of the same span); when the
        table is full it is released and the request refused with ``out_of_memory``."""
        with self._lock:
            full = ident not in table and len(table) >= MAX_PENDING_TRANSFERS
            old = None if full else table.pop(ident, None)
            if not full:
                table[ident] = pending
        if full:
            pending.release()
            raise ProtocolError(
                ErrorCode.OUT_OF_MEMORY,
                f"{MAX_PENDING_TRANSFERS} prepared transfers are waiting for their commit; "
                f"commit them or wait for --pending-transfer-timeout-seconds",
            )
        if old is not None:
            old.release()

    def take(self, table: dict[PendingId, Pending], ident: PendingId) -> Pending | None:
        with self._lock:
            return table.pop(ident, None)

    def drop(
        self,
        predicate: Callable[[int], bool],
        older_than: float | None = None,
        stores_only: bool = False,
    ) -> int:
        """Release the entries of the instance ids ``predicate`` selects (only those created
        before ``older_than`` when given, only prepared stores with ``stores_only``);
        returns how many went."""
        dropped = []
        tables = (self.stores,) if stores_only else (self.stores, self.retrieves)
        with self._lock:
            for table in tables:
                for ident in list(table):
                    pending = table[ident]
                    expired = older_than is None or pending.created < older_than
                    if predicate(ident[0]) and expired:
                        dropped.append(table.pop(ident))
        for pending in dropped:
            pending.release()
        return len(dropped)
