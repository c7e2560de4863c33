"""Asynchronous lookup: lower-tier hits promoted into L1 in the background (server/prefetch.py).

The server runs in-process over a real L1 and a lower tier whose reads the test releases
one by one (:class:`GatedTier`), so each test can assert the very overlap it is about:
a lookup that replied while reads were blocked, a retrieve that waited for an in-flight
read, a session ended with reads still queued.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.state import CacheServerSettings
from lmcache.v1.multiprocess.wire.chunking import prefix_chunks
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager

CHUNK_TOKENS = 16
CHUNK_BYTES = 4096
SHAPE = torch.Size([CHUNK_BYTES])


class GatedTier(StorageBackendInterface):
    """A lower tier holding bytes; each read waits for a permit (``allow``) and may fail."""

    def __init__(self, l1: LocalCPUBackend) -> None:
        super().__init__(dst_device="cpu")
        self.l1 = l1
        self.data: dict[CacheEngineKey, torch.Tensor] = {}
        self.failing: set[CacheEngineKey] = set()
        self.pins: dict[CacheEngineKey, int] = {}
        self._permits = threading.Semaphore(0)
        self._open = threading.Event()
        self._lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.reads = 0

    def allow(self, n: int | None = None) -> None:
        """Let ``n`` more reads through, or every read from now on."""
        if n is None:
            self._open.set()
        else:
            self._permits.release(n)

    def _wait_for_permit(self) -> None:
        deadline = time.monotonic() + 20
        while not self._open.is_set() and not self._permits.acquire(timeout=0.01):
            assert time.monotonic() < deadline, "test never released the read"

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        if key not in self.data:
            return False
        if pin:
            self.pin(key)
        return True

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        hits = 0
        for key in keys:
            if not self.contains(key, pin=pin):
                break
            hits += 1
        return hits

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return False

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> None:
        for key, obj in zip(keys, objs):
            assert obj.tensor is not None
            self.data[key] = obj.tensor.clone()

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.reads += 1
        try:
            self._wait_for_permit()
            if key in self.failing:
                raise ConnectionError("tier went down")
            obj = self.l1.allocate(SHAPE, torch.uint8)
            if obj is None:
                return None
            assert obj.tensor is not None
            obj.tensor.copy_(self.data[key])
            return obj
        finally:
            with self._lock:
                self.active -= 1

    def pin(self, key: CacheEngineKey) -> bool:
        self.pins[key] = self.pins.get(key, 0) + 1
        return True

    def unpin(self, key: CacheEngineKey) -> bool:
        self.pins[key] -= 1
        return True

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        return self.data.pop(key, None) is not None

    def get_allocator_backend(self) -> LocalCPUBackend:
        return self.l1

    def close(self) -> None:
        self.allow()


def _server(
    tier_l1_size: str, max_in_flight: int, wait_timeout: float = 5.0, retain: bool = False
) -> tuple[MPCacheServer, GatedTier]:
    config = LMCacheEngineConfig.from_defaults(
        max_local_cpu_size=tier_l1_size, blocking_timeout_secs=1
    )
    l1 = LocalCPUBackend(config)
    tier = GatedTier(l1)
    backends: OrderedDict[str, StorageBackendInterface] = OrderedDict(
        [("LocalCPUBackend", l1), ("GatedTier", tier)]
    )
    storage = StorageManager(config, backends=backends)
    settings = CacheServerSettings(
        chunk_size=CHUNK_TOKENS,
        prefetch_max_in_flight=max_in_flight,
        prefetch_wait_timeout_seconds=wait_timeout,
        prefetch_retain=retain,
    )
    return MPCacheServer(settings, storage, enable_metrics=False), tier


@pytest.fixture
def make_server() -> Iterator[Callable[..., tuple[MPCacheServer, GatedTier]]]:
    made: list[tuple[MPCacheServer, GatedTier]] = []

    def make(
        max_in_flight: int = 1,
        l1_size: str = "256KiB",
        wait_timeout: float = 5.0,
        retain: bool = False,
    ) -> tuple[MPCacheServer, GatedTier]:
        made.append(_server(l1_size, max_in_flight, wait_timeout, retain))
        return made[-1]

    yield make
    for server, tier in made:
        tier.allow()
        server.close()


def _request(server: MPCacheServer, n_chunks: int, rid: str, seed: int = 0) -> tuple[Any, list]:
    tokens = tuple(seed * 100_000 + i for i in range(n_chunks * CHUNK_TOKENS))
    key = IPCCacheServerKey("org/model", 1, None, tokens, 0, len(tokens), request_id=rid)
    keys = [server._storage_key(key, 0, s.chunk_hash) for s in prefix_chunks(key, CHUNK_TOKENS)]
    return key, keys


def _put_below_l1(tier: GatedTier, keys: list) -> list[torch.Tensor]:
    payloads = []
    for i, key in enumerate(keys):
        payload = torch.randint(0, 256, (CHUNK_BYTES,), dtype=torch.uint8)
        payload[0] = i  # every chunk distinct, so a mix-up cannot pass
        tier.data[key] = payload
        payloads.append(payload)
    return payloads


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def _bytes_of(objs: list[MemoryObj]) -> list[torch.Tensor]:
    out = []
    for obj in objs:
        assert obj.tensor is not None
        out.append(obj.tensor.view(torch.uint8)[:CHUNK_BYTES].clone())
        obj.ref_count_down()
    return out


def test_lookup_replies_at_once_and_status_reports_real_progress(make_server: Any) -> None:
    server, tier = make_server(max_in_flight=1)
    key, keys = _request(server, 4, "r1")
    _put_below_l1(tier, keys)
    server.lookup(key, 1)  # every read is blocked: the lookup must not wait for them
    assert server.query_prefetch_status("r1") is None
    progress = server.query_prefetch_progress("r1")
    assert progress is not None and (progress.total_chunks, progress.done_chunks) == (4, 0)
    assert server.wait_prefetch_status("r1", 0.05) is None

    tier.allow(2)
    _until(lambda: server.query_prefetch_progress("r1").done_chunks == 2)  # type: ignore[union-attr]
    time.sleep(0.05)
    progress = server.query_prefetch_progress("r1")
    assert progress is not None
    assert (progress.done_chunks, progress.failed_chunks, progress.finished) == (2, 0, False)
    assert server.query_prefetch_status("r1") is None

    tier.allow()
    assert server.wait_prefetch_status("r1", 5.0) == 4
    assert server.query_prefetch_progress("r1") == type(progress)("r1", 4, 4, 0, True)
    assert all(server.storage.in_l1(k) for k in keys)
    assert server.query_prefetch_progress("unknown") is None


def test_retrieve_waits_only_for_its_chunks_and_is_bit_exact(make_server: Any) -> None:
    server, tier = make_server(max_in_flight=1)
    key, keys = _request(server, 4, "r1")
    payloads = _put_below_l1(tier, keys)
    server.lookup(key, 1)
    result: list[Any] = []
    retrieve = threading.Thread(target=lambda: result.append(server._get_all(keys[:2])))
    retrieve.start()
    time.sleep(0.2)
    # The retrieve overlaps the prefetch: it is blocked on chunks still being read.
    assert retrieve.is_alive()
    assert server.prefetcher is not None and server.prefetcher.in_flight() == 4
    tier.allow(2)
    retrieve.join(10)
    assert not retrieve.is_alive()
    # It returned while chunks 2 and 3 were still waiting: it waited only for its own.
    assert server.query_prefetch_progress("r1").done_chunks == 2  # type: ignore[union-attr]
    assert result[0] is not None
    for got, want in zip(_bytes_of(result[0]), payloads[:2]):
        assert torch.equal(got, want)
    tier.allow()
    assert server.wait_prefetch_status("r1", 5.0) == 4
    objs = server._get_all(keys)
    assert objs is not None
    assert all(torch.equal(g, w) for g, w in zip(_bytes_of(objs), payloads))
    assert tier.reads == 4  # each chunk read once, by the prefetch: the retrieve read none


def test_retrieve_timing_out_on_a_prefetch_is_a_miss(make_server: Any) -> None:
    server, tier = make_server(max_in_flight=1, wait_timeout=0.3)
    key, keys = _request(server, 2, "r1")
    payloads = _put_below_l1(tier, keys)
    server.lookup(key, 1)
    started = time.monotonic()
    assert server._get_all(keys) is None  # the reads are blocked: a miss after the timeout
    assert 0.25 <= time.monotonic() - started < 5.0
    assert tier.reads == 1  # the retrieve did not read the tier itself
    tier.allow()
    assert server.wait_prefetch_status("r1", 5.0) == 2
    objs = server._get_all(keys)
    assert objs is not None
    assert all(torch.equal(g, w) for g, w in zip(_bytes_of(objs), payloads))


def test_end_session_cancels_queued_reads_and_releases_every_pin(make_server: Any) -> None:
    server, tier = make_server(max_in_flight=1, retain=True)  # promoted chunks stay to check
    key, keys = _request(server, 4, "r1")
    _put_below_l1(tier, keys)
    server.lookup(key, 1)
    tier.allow(1)
    _until(lambda: server.query_prefetch_progress("r1").done_chunks == 1)  # type: ignore[union-attr]
    _until(lambda: tier.reads == 2)  # chunk 1 is being read, chunks 2 and 3 are queued
    l1 = server.storage.local_cpu_backend
    first = l1.get_blocking(keys[0])
    assert first is not None and not first.can_evict  # pinned while the session lives
    assert all(tier.pins[k] == 1 for k in keys)

    server.end_session("r1")
    tier.allow()  # the read in progress finishes after the session ended
    assert server.prefetcher is not None
    _until(lambda: server.prefetcher.in_flight() == 0)  # type: ignore[union-attr]
    assert tier.reads == 2  # the queued reads were cancelled, never issued
    assert all(tier.pins[k] == 0 for k in keys)
    first.ref_count_down()
    for k in keys[:2]:  # both promoted chunks are in L1 and evictable again
        obj = l1.get_blocking(k)
        assert obj is not None
        obj.ref_count_down()
        assert obj.metadata.pin_count == 0 and obj.can_evict
    assert server.pinned_objects() == 0


def test_failing_tier_mid_prefetch_is_a_miss_logged_once(
    make_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    server, tier = make_server(max_in_flight=2)
    key, keys = _request(server, 4, "r1")
    payloads = _put_below_l1(tier, keys)
    tier.failing.add(keys[2])
    server.lookup(key, 1)
    tier.allow()
    with caplog.at_level(logging.WARNING, logger="lmcache.v1.multiprocess.server.prefetch"):
        assert server.wait_prefetch_status("r1", 5.0) == 2  # cut at the failed chunk
        assert server.query_prefetch_status("r1") == 2
    assert sum("could not be promoted" in r.getMessage() for r in caplog.records) == 1
    assert not server.storage.in_l1(keys[2])
    assert server._get_all(keys) is None  # a miss, not a retry or wrong bytes
    objs = server._get_all(keys[:2])
    assert objs is not None
    assert all(torch.equal(g, w) for g, w in zip(_bytes_of(objs), payloads[:2]))
    # The server goes on: a new session prefetches normally once the tier is back.
    server.end_session("r1")
    tier.failing.clear()
    server.lookup(IPCCacheServerKey(**{**key.__dict__, "request_id": "r2"}), 1)
    assert server.wait_prefetch_status("r2", 5.0) == 4


def test_eviction_pressure_does_not_drop_prefetched_chunks(make_server: Any) -> None:
    server, tier = make_server(max_in_flight=2, l1_size=f"{8 * CHUNK_BYTES}B")
    key, keys = _request(server, 4, "r1")
    payloads = _put_below_l1(tier, keys)
    server.lookup(key, 1)
    tier.allow()
    assert server.wait_prefetch_status("r1", 5.0) == 4
    storage = server.storage
    l1 = storage.local_cpu_backend
    before = l1.evictions
    for i in range(16):  # twice L1's size in other chunks, through LRU
        obj = storage.allocate(SHAPE, torch.uint8)
        assert obj is not None
        storage.batched_submit_put_task([CacheEngineKey("other", 1, 0, i, torch.uint8)], [obj])
        obj.ref_count_down()
    assert l1.evictions - before >= 12  # the pressure was real
    assert all(storage.in_l1(k) for k in keys)
    objs = server._get_all(keys)
    assert objs is not None
    assert all(torch.equal(g, w) for g, w in zip(_bytes_of(objs), payloads))


def test_concurrent_reads_are_bounded_by_max_in_flight(make_server: Any) -> None:
    server, tier = make_server(max_in_flight=2)
    key, keys = _request(server, 8, "r1")
    _put_below_l1(tier, keys)
    server.lookup(key, 1)
    _until(lambda: tier.active == 2)
    time.sleep(0.2)
    assert tier.active == 2  # 8 chunks want reading, 2 run
    tier.allow()
    assert server.wait_prefetch_status("r1", 5.0) == 8
    assert tier.peak == 2
    assert server.prefetcher is not None and server.prefetcher.peak_running == 2


def test_disabled_prefetch_is_synchronous(make_server: Any) -> None:
    server, tier = make_server(max_in_flight=0)
    key, keys = _request(server, 2, "r1")
    payloads = _put_below_l1(tier, keys)
    server.lookup(key, 1)
    assert server.prefetcher is None
    assert server.query_prefetch_status("r1") == 2  # known at once, nothing read yet
    assert tier.reads == 0
    tier.allow()
    objs = server._get_all(keys)  # the retrieve reads the lower tier itself
    assert objs is not None and tier.reads == 2
    assert all(torch.equal(g, w) for g, w in zip(_bytes_of(objs), payloads))


def test_disk_read_error_mid_prefetch_is_a_miss(tmp_path: Path) -> None:
    """The real disk tier: a chunk file damaged after the lookup is a miss."""
    config = LMCacheEngineConfig.from_defaults(
        max_local_cpu_size="256KiB",
        blocking_timeout_secs=1,
        local_disk=str(tmp_path),
        max_local_disk_size="1MiB",
    )
    storage = StorageManager(config)
    server = MPCacheServer(
        CacheServerSettings(chunk_size=CHUNK_TOKENS, prefetch_max_in_flight=2),
        storage,
        enable_metrics=False,
    )
    try:
        key, keys = _request(server, 3, "r1")
        payloads = []
        for i, k in enumerate(keys):
            obj = storage.allocate(SHAPE, torch.uint8)
            assert obj is not None and obj.tensor is not None
            obj.tensor.copy_(torch.full((CHUNK_BYTES,), i + 1, dtype=torch.uint8))
            payloads.append(obj.tensor.clone())
            storage.batched_submit_put_task([k], [obj])
            obj.ref_count_down()
        storage.wait_for_puts()
        for k in keys:  # only the disk tier holds them now
            assert storage.local_cpu_backend.remove(k)
        disk = storage.storage_backends["LocalDiskBackend"]
        damaged = Path(disk._index[keys[2]].path)  # type: ignore[attr-defined]
        data = bytearray(damaged.read_bytes())
        data[-10] ^= 0xFF  # a flipped payload byte: the checksum catches it
        damaged.write_bytes(bytes(data))
        server.lookup(key, 1)
        assert server.wait_prefetch_status("r1", 5.0) == 2  # cut at the damaged chunk
        assert server._get_all(keys) is None
        objs = server._get_all(keys[:2])
        assert objs is not None
        assert all(torch.equal(g, w) for g, w in zip(_bytes_of(objs), payloads[:2]))
    finally:
        server.close()


# -- --l2-prefetch-policy (upstream's default and retain) -------------------------------------


def _prefetch_and_end(server: MPCacheServer, tier: GatedTier, n: int) -> list:
    key, keys = _request(server, n, "r1")
    _put_below_l1(tier, keys)
    tier.allow()
    server.lookup(key, 1)
    assert server.wait_prefetch_status("r1", 5.0) == n
    objs = server._get_all(keys)  # the retrieve reads them from L1
    assert objs is not None
    for obj in objs:
        obj.ref_count_down()
    server.end_session("r1")
    return keys


def test_default_prefetch_policy_drops_prefetched_chunks_from_l1_after_the_session(
    make_server: Any,
) -> None:
    server, tier = make_server(max_in_flight=2)
    keys = _prefetch_and_end(server, tier, 3)
    l1 = server.storage.local_cpu_backend
    assert not any(l1.contains(k) for k in keys)  # temporary: gone with their session
    assert all(k in tier.data for k in keys)  # the lower tier still has them


def test_retain_prefetch_policy_keeps_prefetched_chunks_in_l1(make_server: Any) -> None:
    server, tier = make_server(max_in_flight=2, retain=True)
    keys = _prefetch_and_end(server, tier, 3)
    l1 = server.storage.local_cpu_backend
    assert all(l1.contains(k) for k in keys)
    reads = tier.reads
    key, _ = _request(server, 3, "r2")
    server.lookup(key, 1)
    assert server.wait_prefetch_status("r2", 5.0) == 3
    assert tier.reads == reads  # the second request hit L1: no new lower-tier read
    server.end_session("r2")


def test_default_prefetch_policy_keeps_a_chunk_that_was_in_l1_before(make_server: Any) -> None:
    server, tier = make_server(max_in_flight=2)
    key, keys = _request(server, 2, "r1")
    _put_below_l1(tier, keys)
    l1 = server.storage.local_cpu_backend
    resident = l1.allocate(SHAPE, torch.uint8)
    assert resident is not None
    l1.batched_submit_put_task([keys[0]], [resident])  # chunk 0 is an L1 hit already
    resident.ref_count_down()
    tier.allow()
    server.lookup(key, 1)
    assert server.wait_prefetch_status("r1", 5.0) == 2
    server.end_session("r1")
    assert l1.contains(keys[0])  # not the prefetcher's to drop
    assert not l1.contains(keys[1])
