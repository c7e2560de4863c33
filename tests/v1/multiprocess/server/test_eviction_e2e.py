"""Eviction policies behind a real server and worker: stores of two tenants through the
wire, quotas set on the server's registry, and what a later lookup still finds."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import pytest
from mp_server_helpers import free_port, make_kv, unlink_kv

from lmcache.v1.multiprocess.server import MPServer, build_cache_server
from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

CHUNK = 16
GEO = {"num_layers": 2, "num_heads": 2, "head_size": 16, "num_blocks": 16, "block_size": 4}
CHUNK_BYTES = 2 * 2 * CHUNK * 2 * 16 * 2  # K/V x layers x tokens x heads x head size x bf16
L1_CHUNKS = 8
BLOCKS = list(range(8))  # one prompt: two chunks of four blocks


def _prompt(i: int) -> list[int]:
    return [1000 * i + t for t in range(2 * CHUNK)]


Serve = Callable[[str], tuple[MPCacheServer, KVCacheWorker]]


@pytest.fixture
def serve() -> Iterator[Serve]:
    made: list[tuple[MPServer, threading.Thread, KVCacheWorker, list]] = []

    def start(policy: str) -> tuple[MPCacheServer, KVCacheWorker]:
        config = MPServerConfig(
            port=free_port(),
            chunk_size=CHUNK,
            l1_size_gb=L1_CHUNKS * CHUNK_BYTES / 1024**3,
            eviction_policy=policy,
            shm_name=f"lmc-evict-{uuid.uuid4().hex[:8]}",
            http_port=0,
            prometheus_port=0,
            blocking_timeout_secs=1,
        )
        engine = build_cache_server(config)
        server = MPServer(config, engine)
        loop = threading.Thread(target=server.serve_forever, daemon=True)
        loop.start()
        kv = make_kv(seed=1, **GEO)
        worker = KVCacheWorker(
            kv, model_name="m", server_url=server.endpoint, mode="engine_driven", sub_path="inline"
        )
        made.append((server, loop, worker, kv))
        return engine, worker

    yield start
    for server, loop, worker, kv in made:
        worker.close()
        unlink_kv(kv)
        server.request_stop()
        loop.join(15)
        server.close()


def _store_two_tenants(engine: MPCacheServer, worker: KVCacheWorker) -> int:
    """Alice stores 2 prompts within her quota, then bob floods L1 with 10; how many of
    alice's tokens a lookup still finds."""
    engine.storage.quota_manager.set_quota("alice", 4 * CHUNK_BYTES)
    engine.storage.quota_manager.set_quota("bob", CHUNK_BYTES)
    for i in range(2):
        assert worker.store(_prompt(i), BLOCKS, cache_salt="alice")
    for i in range(10, 20):
        assert worker.store(_prompt(i), BLOCKS, cache_salt="bob")
    assert engine.storage.local_cpu_backend.evictions > 0
    return sum(worker.lookup(_prompt(i), cache_salt="alice") for i in range(2))


def test_isolated_lru_keeps_the_tenant_within_its_quota(serve: Serve) -> None:
    engine, worker = serve("IsolatedLRU")
    assert _store_two_tenants(engine, worker) == 2 * 2 * CHUNK  # every chunk of alice's
    usage = engine.storage.get_usage_bytes_by_cache_salt()
    assert usage["alice"] == 4 * CHUNK_BYTES
    # Bob fills what is left when a put needs it; L1's watermark pass (default 0.8) may
    # already have trimmed him back to his quota, never below it.
    assert CHUNK_BYTES <= usage["bob"] <= 4 * CHUNK_BYTES


def test_lru_lets_the_flooding_tenant_push_the_other_out(serve: Serve) -> None:
    # The same stores under plain LRU: the quota is ignored, alice's older chunks go.
    engine, worker = serve("LRU")
    assert _store_two_tenants(engine, worker) == 0


def test_noop_refuses_stores_once_full_and_keeps_what_it_has(serve: Serve) -> None:
    engine, worker = serve("noop")
    for i in range(L1_CHUNKS // 2):
        assert worker.store(_prompt(i), BLOCKS)
    try:
        refused = not worker.store(_prompt(99), BLOCKS)
    except Exception as exc:  # the server's out_of_memory answer
        refused = "out_of_memory" in str(exc) or "room" in str(exc)
    assert refused
    assert engine.storage.local_cpu_backend.evictions == 0
    assert all(worker.lookup(_prompt(i)) == 2 * CHUNK for i in range(L1_CHUNKS // 2))
