"""KV events: what enters and leaves the server's CPU tier (L1), per model and chunk hash.

A KV-aware router subscribes (``subscribe_kv_events``) to learn which prefixes the server
holds.  The server keeps, per model, a bounded log of sequenced records:

* ``stored`` when a chunk hash becomes resident in L1 (whichever path put it there:
  LMCache-driven stores, engine-driven SHM or inline commits, lower-tier promotions);
* ``removed`` when the last copy of it leaves L1 (eviction, explicit removal, ``clear``).

With several ranks (tensor parallelism) each rank's chunk is its own L1 object; a hash
is announced when the first rank's chunk arrives and withdrawn when the last one goes,
so the announced set is exactly the set of hashes with at least one chunk in L1.

Records are ordered by ``seq`` (1, 2, ... per model).  A subscriber reads the records
after its cursor and resumes at ``next_cursor``; when the bounded log has already dropped
records after the cursor, the answer says ``lost`` and the subscriber must forget what it
learnt.  Reading never waits and never blocks a store: a slow or vanished subscriber only
loses records, and the server keeps no state per subscriber.

Tokens and parent hash of a stored chunk come from the key that planned it (see
:meth:`KVEventLog.bind_tokens`), kept in a bounded table; a chunk that arrives without a
known key (a promotion from a lower tier long after its store) is announced without tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

from lmcache.utils import chunk_hashes
from lmcache.v1.multiprocess.wire.chunking import ChunkSpan, salt_prefix_hash
from lmcache.v1.multiprocess.wire.custom_types import (
    KV_EVENT_KIND_REMOVED,
    KV_EVENT_KIND_STORED,
    KV_EVENT_MEDIUM_CPU,
    IPCCacheServerKey,
    KVEventBatch,
    KVEventRecord,
)
from lmcache.v1.storage_backend.cache_salt import salt_of

logger = logging.getLogger(__name__)

# Upstream's default for --kv-event-log-size (records kept per model).
DEFAULT_KV_EVENT_LOG_SIZE = 32768
# Chunks whose tokens and parent are remembered for their 'stored' record; trimmed to half
# when full (oldest first), so the table stays bounded whatever the traffic.
TOKEN_BINDING_CAPACITY = 65536
# A tenant's read scans at most this many records per record it may return.
_VISIBLE_SCAN_FACTOR = 8


def hash_bytes(chunk_hash: int) -> bytes:
    """A chunk hash as it travels in KV events: 8 big-endian bytes."""
    return (chunk_hash & ((1 << 64) - 1)).to_bytes(8, "big")


@dataclasses.dataclass
class _ModelLog:
    records: deque[KVEventRecord]
    # The cache salt of each record (same positions): a tenant reads only its salts' events.
    salts: deque[str]
    next_seq: int = 1


class KVEventLog:
    """The per-model bounded event logs and the L1 residency they are derived from.

    ``capacity`` is the number of records kept per model; 0 disables the events (the
    log then records nothing and every read answers ``enabled=False``).
    """

    def __init__(self, capacity: int = DEFAULT_KV_EVENT_LOG_SIZE) -> None:
        if capacity < 0:
            raise ValueError(f"the KV event log size must be >= 0, got {capacity}")
        self.capacity = capacity
        self.enabled = capacity > 0
        # Changes when the server restarts: a subscriber's cursor means nothing across it.
        self.incarnation = time.time_ns()
        self._lock = threading.Lock()
        self._logs: dict[str, _ModelLog] = {}
        # (model, chunk hash) -> how many rank chunks of it are in L1 (bounded by L1).
        self._resident: dict[tuple[str, int], int] = {}
        self._bindings: OrderedDict[tuple[str, int], tuple[tuple[int, ...], int | None]] = (
            OrderedDict()
        )
        self.unbound_stores = 0

    # -- inputs -------------------------------------------------------------------------------

    def bind_tokens(
        self, key: IPCCacheServerKey, spans: Sequence[ChunkSpan], chunk_size: int
    ) -> None:
        """Remember the tokens and parent hash of each planned chunk (content-addressed:
        a hash always names the same tokens, so binding on any plan is correct)."""
        if not self.enabled or not spans:
            return
        parent = self._parent_of_first(key, spans[0], chunk_size)
        entries = []
        for span in spans:
            tokens = tuple(key.token_ids[span.start : span.start + span.num_tokens])
            entries.append(((key.model_name, span.chunk_hash), (tokens, parent)))
            parent = span.chunk_hash
        with self._lock:
            for name, binding in entries:
                self._bindings[name] = binding
                self._bindings.move_to_end(name)
            if len(self._bindings) > TOKEN_BINDING_CAPACITY:
                while len(self._bindings) > TOKEN_BINDING_CAPACITY // 2:
                    self._bindings.popitem(last=False)

    @staticmethod
    def _parent_of_first(key: IPCCacheServerKey, span: ChunkSpan, chunk_size: int) -> int | None:
        """The hash of the chunk before ``span`` (it names the whole prefix before it)."""
        if span.start == 0:
            return None
        prefix = key.token_ids[: span.start]
        return chunk_hashes(
            prefix, chunk_size, save_unfull_chunk=True, prefix_hash=salt_prefix_hash(key.cache_salt)
        )[-1]

    def on_l1_change(self, key: Any, present: bool) -> None:
        """Residency listener of the L1 tier: ``key`` (a ``CacheEngineKey``) entered
        (``present``) or left L1.  Called under the tier's lock: cheap, never re-enters
        storage."""
        if not self.enabled:
            return
        name = (key.model_name, int(key.chunk_hash))
        salt = salt_of(key)
        with self._lock:
            count = self._resident.get(name, 0)
            if present:
                self._resident[name] = count + 1
                if count == 0:
                    self._append_stored(name, salt)
                return
            if count <= 1:
                self._resident.pop(name, None)
                if count == 1:
                    removed = [hash_bytes(name[1])]
                    self._append(name[0], KV_EVENT_KIND_REMOVED, removed, None, [], salt)
            else:
                self._resident[name] = count - 1

    def _append_stored(self, name: tuple[str, int], salt: str) -> None:
        binding = self._bindings.get(name)
        if binding is None:
            self.unbound_stores += 1
            tokens: list[int] = []
            parent: bytes | None = None
        else:
            tokens = list(binding[0])
            parent = None if binding[1] is None else hash_bytes(binding[1])
        self._append(name[0], KV_EVENT_KIND_STORED, [hash_bytes(name[1])], parent, tokens, salt)

    def _append(
        self,
        model_name: str,
        kind: str,
        hashes: list[bytes],
        parent: bytes | None,
        tokens: list[int],
        salt: str = "",
    ) -> None:
        log = self._logs.get(model_name)
        if log is None:
            log = self._logs[model_name] = _ModelLog(
                deque(maxlen=self.capacity), deque(maxlen=self.capacity)
            )
        log.salts.append(salt)
        log.records.append(
            KVEventRecord(
                seq=log.next_seq,
                kind=kind,
                medium=KV_EVENT_MEDIUM_CPU,
                model_name=model_name,
                block_hashes=hashes,
                parent_block_hash=parent,
                token_ids=tokens,
            )
        )
        log.next_seq += 1

    # -- outputs ------------------------------------------------------------------------------

    def read(
        self,
        model_name: str,
        cursor: int,
        max_events: int,
        visible: Callable[[str], bool] | None = None,
    ) -> KVEventBatch:
        """Up to ``max_events`` records of ``model_name`` after ``cursor`` (0: from the
        start); never waits.  ``visible`` (a tenant's reader): only records of the salts
        it accepts; the others are skipped, and the cursor moves past them."""
        if visible is not None:
            return self._read_visible(model_name, cursor, max_events, visible)
        if cursor < 0 or max_events <= 0:
            raise ValueError("cursor must be >= 0 and max_events positive")
        if not self.enabled:
            return KVEventBatch(False, self.incarnation, 0, False, [])
        with self._lock:
            log = self._logs.get(model_name)
            last = 0 if log is None else log.next_seq - 1
            first = log.records[0].seq if log is not None and log.records else last + 1
            # Records after the cursor were trimmed, or the cursor is from the future
            # (another incarnation): either way the subscriber's picture is wrong.
            lost = cursor + 1 < first or cursor > last
            start = max(cursor + 1, first)
            records: list[KVEventRecord] = []
            if log is not None and start <= last:
                records = list(islice(log.records, start - first, start - first + max_events))
            next_cursor = records[-1].seq if records else min(cursor, last)
            if lost and not records:
                next_cursor = last
            return KVEventBatch(True, self.incarnation, next_cursor, lost, records)

    def _read_visible(
        self, model_name: str, cursor: int, max_events: int, visible: Callable[[str], bool]
    ) -> KVEventBatch:
        batch = self.read(model_name, cursor, max_events * _VISIBLE_SCAN_FACTOR)
        if not batch.enabled:
            return batch
        with self._lock:
            log = self._logs.get(model_name)
            first = log.records[0].seq if log is not None and log.records else 0
            salts = {} if log is None else {
                r.seq: log.salts[r.seq - first] for r in batch.events if r.seq >= first
            }  # fmt: skip
        kept: list[KVEventRecord] = []
        next_cursor = batch.next_cursor
        for record in batch.events:
            if len(kept) == max_events:
                next_cursor = kept[-1].seq
                break
            if visible(salts.get(record.seq, "")):
                kept.append(record)
        return KVEventBatch(batch.enabled, batch.incarnation, next_cursor, batch.lost, kept)

    def resident_hashes(self, model_name: str) -> set[bytes]:
        """The hashes of ``model_name`` with a chunk in L1 (what the events announce)."""
        with self._lock:
            return {hash_bytes(h) for (m, h) in self._resident if m == model_name}

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "enabled": self.enabled,
                "incarnation": self.incarnation,
                "log_capacity": self.capacity,
                "models": len(self._logs),
                "log_depth": sum(len(log.records) for log in self._logs.values()),
                "resident_hashes": len(self._resident),
                "unbound_stores": self.unbound_stores,
            }
