"""Redis going away and coming back; corrupt values.  Real redis-server processes only."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import expected_tensor, fill_obj, make_config, make_key
from redis_servers import RedisServer, free_port, make_redis_backend, skip_without_redis
from test_backend_conformance import _get_value as _value

from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.redis_backend import RedisBackend, RedisUnavailableError
from lmcache.v1.storage_backend.storage_manager import StorageManager

pytestmark = pytest.mark.redis

RETRY_S = 0.2


def _manager(redis_tier: RedisBackend, cpu: LocalCPUBackend) -> StorageManager:
    backends: OrderedDict[str, StorageBackendInterface] = OrderedDict()
    backends["LocalCPUBackend"] = cpu
    backends["RedisBackend"] = redis_tier
    return StorageManager(make_config(), backends=backends)


def _wait_until(predicate: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_unreachable_at_start_is_a_clear_error() -> None:
    skip_without_redis()
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    port = free_port()
    with pytest.raises(RedisUnavailableError, match=f"127.0.0.1:{port}.*optional"):
        make_redis_backend(f"redis://127.0.0.1:{port}", cpu, connect_timeout_s=0.5)
    cpu.close()


def test_optional_tier_starts_disabled_and_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    skip_without_redis()
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    server = RedisServer(tmp_path)
    with caplog.at_level(logging.WARNING):
        tier = make_redis_backend(
            server.url, cpu, optional=True, retry_interval_s=RETRY_S, connect_timeout_s=0.5
        )
    assert "redis tier unavailable" in caplog.text
    assert not tier.available
    obj = fill_obj(cpu, 3)
    for future in tier.batched_submit_put_task([make_key(3)], [obj]) or []:
        future.result()  # never raises
    assert tier.get_stats()["puts_dropped"] == 1
    assert tier.batched_contains([make_key(3)]) == 0 and tier.get_blocking(make_key(3)) is None
    server.start()
    try:
        time.sleep(RETRY_S * 1.5)
        tier.batched_contains([make_key(3)])  # the probe that finds it back
        assert tier.available
        for future in tier.batched_submit_put_task([make_key(3)], [obj]) or []:
            future.result()
        assert torch.equal(_value(tier, 3), expected_tensor(3))  # type: ignore[arg-type]
    finally:
        obj.ref_count_down()
        tier.close()
        cpu.close()
        server.stop()


def test_sigkill_mid_stream_then_restart(own_redis_server: RedisServer) -> None:
    """Puts stream through a manager (L1 + Redis) while redis-server is SIGKILLed: nothing
    raises, nothing wrong is returned, L1 keeps serving; after a restart puts land again."""
    cpu = LocalCPUBackend(make_config(max_local_cpu_size="4MiB"))
    tier = make_redis_backend(own_redis_server.url, cpu, retry_interval_s=RETRY_S)
    manager = _manager(tier, cpu)
    errors: list[BaseException] = []
    stop = threading.Event()
    written: list[int] = []

    def stream() -> None:
        i = 0
        while not stop.is_set():
            try:
                obj = fill_obj(manager, i)
                manager.batched_submit_put_task([make_key(i)], [obj])
                obj.ref_count_down()
                written.append(i)
                i += 1
                time.sleep(0.002)
            except BaseException as exc:  # pragma: no cover - the assertion below reports it
                errors.append(exc)
                return

    writer = threading.Thread(target=stream)
    writer.start()
    try:
        assert _wait_until(lambda: tier.get_stats()["puts"] >= 20)
        own_redis_server.kill()
        assert _wait_until(lambda: tier.get_stats()["puts_dropped"] >= 5)
    finally:
        stop.set()
        writer.join(timeout=10)
    assert not errors, errors
    manager.wait_for_puts()
    assert not tier.available
    # Reads while Redis is dead: the tier is a miss, L1 still serves, nothing is wrong.
    for i in written[-50:]:
        got = _value(manager, i)
        assert got is None or torch.equal(got, expected_tensor(i))
        tier_got = _value(tier, i)
        assert tier_got is None
    assert tier.batched_contains([make_key(i) for i in written]) == 0
    assert manager.batched_contains([make_key(written[-1])]) == 1  # from L1

    own_redis_server.start()  # same port, empty (no persistence)
    time.sleep(RETRY_S * 1.5)
    new_key = 10_000
    assert _wait_until(lambda: tier.batched_contains([make_key(new_key)]) == 0 and tier.available)
    obj = fill_obj(manager, new_key)
    for future in tier.batched_submit_put_task([make_key(new_key)], [obj]) or []:
        future.result()
    obj.ref_count_down()
    assert torch.equal(_value(tier, new_key), expected_tensor(new_key))  # type: ignore[arg-type]
    stats = tier.get_stats()
    assert stats["outages"] >= 1 and stats["puts_dropped"] >= 5
    manager.close()


def _raw(server: RedisServer) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=server.port)


@pytest.mark.parametrize("damage", ["flip_payload", "flip_header", "truncate", "wrong_key"])
def test_corrupt_value_is_a_miss_and_deleted(redis_server: RedisServer, damage: str) -> None:
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    tier = make_redis_backend(redis_server.url, cpu)
    raw = _raw(redis_server)
    try:
        for i in (1, 2):
            obj = fill_obj(cpu, i)
            for future in tier.batched_submit_put_task([make_key(i)], [obj]) or []:
                future.result()
            obj.ref_count_down()
        name = tier.redis_key(make_key(1))
        value = bytearray(raw.get(name))
        if damage == "flip_payload":
            value[-7] ^= 0x01
        elif damage == "flip_header":
            value[40] ^= 0x20
        elif damage == "truncate":
            del value[-100:]
        else:
            value = bytearray(raw.get(tier.redis_key(make_key(2))))
        raw.set(name, bytes(value))
        assert tier.get_blocking(make_key(1)) is None
        assert raw.exists(name) == 0
        assert tier.get_stats()["corrupt"] == 1
        assert torch.equal(_value(tier, 2), expected_tensor(2))  # type: ignore[arg-type]
        # The slot is free again: a fresh put repairs the entry.
        obj = fill_obj(cpu, 1)
        for future in tier.batched_submit_put_task([make_key(1)], [obj]) or []:
            future.result()
        obj.ref_count_down()
        assert torch.equal(_value(tier, 1), expected_tensor(1))  # type: ignore[arg-type]
    finally:
        raw.close()
        tier.close()
        cpu.close()


def test_open_breaker_is_degraded_not_unhealthy(tmp_path: Path) -> None:
    """While the breaker is open the tier says why it serves less (the server reports it
    degraded, 200); it is never a health problem (503), and clears once Redis is back."""
    from lmcache.v1.multiprocess.server.tiers import tier_degradations, tier_problems

    skip_without_redis()
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    server = RedisServer(tmp_path)
    tier = make_redis_backend(
        server.url, cpu, optional=True, retry_interval_s=RETRY_S, connect_timeout_s=0.5
    )
    manager = _manager(tier, cpu)
    try:
        (reason,) = tier.health_degraded()
        assert "circuit breaker open" in reason and server.url in reason
        assert tier_problems(manager) == []
        assert tier_degradations(manager) == [f"RedisBackend: {reason}"]
        server.start()
        assert _wait_until(lambda: tier.batched_contains([make_key(1)]) == 0 and tier.available)
        assert tier.health_degraded() == [] and tier_degradations(manager) == []
    finally:
        manager.close()
        server.stop()
