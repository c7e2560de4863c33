"""The server reads evictions from the tiers' own counters and leaves their policies alone."""

from __future__ import annotations

from pathlib import Path

import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.multiprocess.server.tiers import describe_tiers, install_eviction_counters
from lmcache.v1.storage_backend.storage_manager import StorageManager

SHAPE = torch.Size([1024])  # 2 KiB of half


def _key(i: int) -> CacheEngineKey:
    return CacheEngineKey("org/model", 1, 0, i, torch.half)


def _store(storage: StorageManager, i: int) -> None:
    obj = storage.allocate(SHAPE, torch.half)
    assert obj is not None
    storage.batched_submit_put_task([_key(i)], [obj])
    storage.wait_for_puts()
    obj.ref_count_down()


def test_evictions_come_from_the_tiers_and_policies_stay_untouched(tmp_path: Path) -> None:
    config = LMCacheEngineConfig.from_defaults(
        max_local_cpu_size="8KiB",
        blocking_timeout_secs=1,
        local_disk=str(tmp_path),
        max_local_disk_size="1MiB",
    )
    storage = StorageManager(config)
    try:
        policies = {n: b._policy for n, b in storage.storage_backends.items()}  # type: ignore[attr-defined]
        counters = install_eviction_counters(storage)
        assert set(counters) == set(storage.storage_backends)
        for name, backend in storage.storage_backends.items():
            assert backend._policy is policies[name]  # type: ignore[attr-defined]
        for i in range(8):  # 16 KiB through an 8 KiB L1
            _store(storage, i)
        l1 = storage.local_cpu_backend
        assert l1.evictions > 0
        tiers = {t["name"]: t for t in describe_tiers(storage, counters)}
        assert tiers["LocalCPUBackend"]["evictions"] == l1.evictions
        before = l1.evictions
        for key in l1.get_keys():
            assert storage.remove(key)
        assert l1.evictions == before  # removals the server asks for are not evictions
    finally:
        storage.close()


def test_unreachable_redis_is_degraded_not_unhealthy(tmp_path: Path) -> None:
    """An optional Redis tier that cannot be reached: /healthcheck answers 200 "degraded"
    with the reason (a restart would not bring Redis back), /status lists it apart from
    the problems, and the server counts as healthy."""
    import json
    import socket

    from fastapi.testclient import TestClient
    from prerequisites import require_module

    from lmcache.v1.multiprocess.server import build_cache_server
    from lmcache.v1.multiprocess.server.http_frontend import build_app
    from lmcache.v1.multiprocess.server_config import MPServerConfig

    require_module("redis", "redis-py not installed (pip install 'lmcache-core[redis]')")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = int(sock.getsockname()[1])
    redis = {
        "type": "resp",
        "url": f"redis://127.0.0.1:{closed_port}",
        "optional": True,
        "connect_timeout_s": 0.2,
        "timeout_s": 0.2,
        "retry_interval_s": 3600,
    }
    engine = build_cache_server(
        MPServerConfig(
            chunk_size=16,
            l1_size_gb=1 / 64,
            shm_name="",
            disable_metrics=True,
            l2_prefetch_max_in_flight=0,
            l2_adapters=[json.dumps(redis)],
        )
    )
    try:
        reply = TestClient(build_app(engine)).get("/healthcheck")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["status"] == "degraded"
        (reason,) = body["problems"]
        assert f"127.0.0.1:{closed_port}" in reason and "circuit breaker open" in reason
        status = engine.status()
        assert status["healthy"] is True and status["problems"] == []
        assert status["degraded"] == [reason]
    finally:
        engine.close()
