"""KV events (server/kv_events.py): a subscriber that follows ``subscribe_kv_events``
over the wire rebuilds exactly the set of chunk hashes the server's L1 holds, through
stores on every path, evictions, explicit removals and ``clear``; a cursor that fell out
of the bounded log is reported ``lost``."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from mp_server_helpers import in_process_server, make_kv, unlink_kv

from lmcache.utils import chunk_hashes
from lmcache.v1.multiprocess.server import MPServer
from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.kv_events import KVEventLog, hash_bytes
from lmcache.v1.multiprocess.wire.chunking import plan_chunks
from lmcache.v1.multiprocess.wire.custom_types import (
    KV_EVENT_CAPABILITY,
    KV_EVENT_KIND_REMOVED,
    KV_EVENT_KIND_STORED,
    IPCCacheServerKey,
    KVEventBatch,
)
from lmcache.v1.multiprocess.worker.client import MPClient, ServerError
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

CHUNK = 16
# 4 layers x 2 (K, V) x 16 tokens x 8 heads x 128 x bf16 = 256 KiB per chunk: a 2 MiB L1
# holds 8 chunks, so a few prompts evict.
GEO = {"num_layers": 4, "num_heads": 8, "head_size": 128, "num_blocks": 48, "block_size": 4}
L1_GB = 2 / 1024


class Subscriber:
    """A KV-aware router's view: follows the events from cursor 0 and keeps the set."""

    def __init__(self, url: str, model_name: str, page: int = 7) -> None:
        self.client = MPClient(url, timeout=10)
        self.model_name = model_name
        self.page = page
        self.cursor = 0
        self.cached: set[bytes] = set()
        self.incarnation: int | None = None
        self.losses = 0
        self.batches = 0

    def poll(self) -> KVEventBatch:
        batch: KVEventBatch = self.client.call(
            "subscribe_kv_events", 77, self.model_name, self.cursor, self.page
        )
        self.batches += 1
        if self.incarnation is not None and batch.incarnation != self.incarnation:
            self.cached.clear()  # the server restarted: nothing it said still holds
        self.incarnation = batch.incarnation
        if batch.lost:
            self.losses += 1
            self.cached.clear()
        for record in batch.events:
            if record.kind == KV_EVENT_KIND_STORED:
                self.cached.update(record.block_hashes)
            elif record.kind == KV_EVENT_KIND_REMOVED:
                self.cached.difference_update(record.block_hashes)
        self.cursor = batch.next_cursor
        return batch

    def catch_up(self) -> None:
        while self.poll().events:
            pass

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def served() -> Iterator[tuple[MPServer, MPCacheServer]]:
    with in_process_server(
        chunk_size=CHUNK, l1_size_gb=L1_GB, max_workers=2, enable_admin_ops=True
    ) as pair:
        yield pair


def _l1_hashes(engine: MPCacheServer, model_name: str) -> set[bytes]:
    keys = engine.storage.local_cpu_backend.get_keys()
    return {hash_bytes(k.chunk_hash) for k in keys if k.model_name == model_name}


def _prompt(seed: int, chunks: int) -> list[int]:
    return [seed * 1000 + i for i in range(chunks * CHUNK)]


def _call(server: MPServer, operation: str, *payloads: Any) -> Any:
    """One request on a client of its own, closed afterwards."""
    with MPClient(server.endpoint) as client:
        return client.call(operation, *payloads)


def test_subscriber_rebuilds_the_l1_set_through_stores_evictions_and_clear(
    served: tuple[MPServer, MPCacheServer],
) -> None:
    server, engine = served
    model = f"ev-{uuid.uuid4().hex[:6]}"
    assert KV_EVENT_CAPABILITY in _call(server, "get_experimental")
    sub = Subscriber(server.endpoint, model)
    stop = threading.Event()
    errors: list[BaseException] = []

    def follow() -> None:  # polls while the stores run, as a live router would
        try:
            while not stop.is_set():
                sub.poll()
                time.sleep(0.002)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    kv_shm = make_kv(shm=True, seed=1, **GEO)
    kvs = [make_kv(seed=2, **GEO), make_kv(seed=3, **GEO)]
    workers = [
        KVCacheWorker(kv_shm, model_name=model, server_url=server.endpoint, mode="lmcache_driven"),
        KVCacheWorker(
            kvs[0],
            model_name=model,
            server_url=server.endpoint,
            mode="engine_driven",
            sub_path="shm",
        ),
        KVCacheWorker(
            kvs[1],
            model_name=model,
            server_url=server.endpoint,
            mode="engine_driven",
            sub_path="inline",
        ),
    ]
    follower = threading.Thread(target=follow)
    follower.start()
    try:
        blocks = list(range(GEO["num_blocks"]))
        stored_any = 0
        for round_ in range(4):
            for index, worker in enumerate(workers):
                # 3 chunks per prompt, 9 per round: beyond the 8 that fit, so L1 evicts.
                stored_any += worker.store(_prompt(10 * round_ + index, 3), blocks[:12])
        assert stored_any > 0
        assert engine.storage.local_cpu_backend.evictions > 0, "the test must evict"
        # An explicit removal of one resident chunk.
        victim = engine.storage.local_cpu_backend.get_keys()[0]
        assert engine.storage.remove(victim)
        stop.set()
        follower.join(30)
        assert not errors, errors
        sub.catch_up()
        assert sub.losses == 0
        assert sub.cached == _l1_hashes(engine, model)
        assert sub.cached, "something must still be cached"
        assert hash_bytes(victim.chunk_hash) not in sub.cached

        with MPClient(server.endpoint) as admin:
            admin.clear()
        sub.catch_up()
        assert sub.cached == _l1_hashes(engine, model) == set()
    finally:
        stop.set()
        follower.join(30)
        for worker in workers:
            worker.close()
        sub.close()
        unlink_kv(kv_shm)


def test_stored_records_carry_tokens_and_parent_of_each_chunk(
    served: tuple[MPServer, MPCacheServer],
) -> None:
    server, _engine = served
    model = f"ev-{uuid.uuid4().hex[:6]}"
    tokens = _prompt(5, 3)
    kv = make_kv(seed=4, **GEO)
    with KVCacheWorker(
        kv, model_name=model, server_url=server.endpoint, mode="engine_driven", sub_path="inline"
    ) as worker:
        # The first chunk alone, then the rest from a chunk-aligned start (the parent of
        # the second chunk comes from a prefix the second store did not carry).
        assert worker.store(tokens, list(range(12)), 0, CHUNK)
        assert worker.store(tokens, list(range(12)), CHUNK, 3 * CHUNK)
    batch: KVEventBatch = _call(server, "subscribe_kv_events", 1, model, 0, 100)
    hashes = chunk_hashes(tokens, CHUNK)
    assert [r.kind for r in batch.events] == [KV_EVENT_KIND_STORED] * 3
    assert [r.seq for r in batch.events] == [1, 2, 3] and batch.next_cursor == 3
    assert [r.block_hashes for r in batch.events] == [[hash_bytes(h)] for h in hashes]
    assert [r.parent_block_hash for r in batch.events] == [
        None,
        hash_bytes(hashes[0]),
        hash_bytes(hashes[1]),
    ]
    assert [r.token_ids for r in batch.events] == [
        tokens[i * CHUNK : (i + 1) * CHUNK] for i in range(3)
    ]
    assert {r.medium for r in batch.events} == {"CPU"}
    # Another model's subscriber sees nothing of it.
    other: KVEventBatch = _call(server, "subscribe_kv_events", 1, "other", 0, 9)
    assert other.events == [] and not other.lost


def test_bad_subscription_arguments_get_typed_errors(
    served: tuple[MPServer, MPCacheServer],
) -> None:
    server, _engine = served
    for cursor, max_events in ((-1, 10), (0, 0), (0, 1025)):
        with pytest.raises(ServerError) as info:
            _call(server, "subscribe_kv_events", 1, "m", cursor, max_events)
        assert info.value.code == "bad_payload"


# -- the log itself ----------------------------------------------------------------------------


class _Key:
    def __init__(self, model_name: str, chunk_hash: int) -> None:
        self.model_name = model_name
        self.chunk_hash = chunk_hash


def test_a_cursor_that_fell_out_of_the_log_is_lost() -> None:
    log = KVEventLog(capacity=4)
    for h in range(1, 11):
        log.on_l1_change(_Key("m", h), True)
    batch = log.read("m", 2, 100)  # records 3..6 were trimmed (the log keeps 7..10)
    assert batch.lost and [r.seq for r in batch.events] == [7, 8, 9, 10]
    assert batch.next_cursor == 10
    follow = log.read("m", batch.next_cursor, 100)
    assert not follow.lost and follow.events == [] and follow.next_cursor == 10
    assert not log.read("m", 6, 100).lost  # 7 is the next record: nothing missed
    # A cursor from the future (a restarted server's subscriber) is lost too.
    future = log.read("m", 50, 100)
    assert future.lost and future.next_cursor == 10
    # Pages: at most max_events records, resuming where the last ended.
    page = log.read("m", 6, 3)
    assert [r.seq for r in page.events] == [7, 8, 9] and page.next_cursor == 9


def test_a_hash_is_announced_while_any_rank_holds_it() -> None:
    log = KVEventLog(capacity=16)
    log.on_l1_change(_Key("m", 5), True)  # rank 0
    log.on_l1_change(_Key("m", 5), True)  # rank 1: already announced
    log.on_l1_change(_Key("m", 5), False)  # one rank's copy evicted: still cached
    assert log.resident_hashes("m") == {hash_bytes(5)}
    log.on_l1_change(_Key("m", 5), False)
    kinds = [r.kind for r in log.read("m", 0, 10).events]
    assert kinds == [KV_EVENT_KIND_STORED, KV_EVENT_KIND_REMOVED]
    assert log.resident_hashes("m") == set()
    assert log.status()["unbound_stores"] == 1  # nothing bound its tokens


def test_disabled_log_records_nothing_and_says_so() -> None:
    log = KVEventLog(capacity=0)
    log.on_l1_change(_Key("m", 5), True)
    batch = log.read("m", 0, 10)
    assert not batch.enabled and batch.events == []
    with pytest.raises(ValueError):
        KVEventLog(capacity=-1)


def test_token_bindings_follow_the_plan_and_stay_bounded(monkeypatch: Any) -> None:
    from lmcache.v1.multiprocess.server import kv_events

    monkeypatch.setattr(kv_events, "TOKEN_BINDING_CAPACITY", 8)
    log = KVEventLog(capacity=64)
    tokens = tuple(range(CHUNK * 6))
    key = IPCCacheServerKey("m", 1, 0, tokens, 2 * CHUNK, 5 * CHUNK + 3, cache_salt="salt")
    spans = plan_chunks(key, CHUNK)
    log.bind_tokens(key, spans, CHUNK)
    full = plan_chunks(
        IPCCacheServerKey("m", 1, 0, tokens, 0, 5 * CHUNK + 3, cache_salt="salt"), CHUNK
    )
    for span in spans:
        log.on_l1_change(_Key("m", span.chunk_hash), True)
    events = log.read("m", 0, 10).events
    assert [r.parent_block_hash for r in events] == [
        hash_bytes(full[i - 1].chunk_hash) for i in range(2, 6)
    ]
    assert events[-1].token_ids == list(tokens[5 * CHUNK : 5 * CHUNK + 3])  # partial chunk
    for n in range(20):
        log.bind_tokens(
            IPCCacheServerKey("m", 1, 0, (n,) * CHUNK, 0, CHUNK),
            plan_chunks(IPCCacheServerKey("m", 1, 0, (n,) * CHUNK, 0, CHUNK), CHUNK),
            CHUNK,
        )
    assert len(log._bindings) <= 8
