"""A hung Redis (SIGSTOP) and a dead cluster node: lookups are misses within the socket
timeout, never exceptions, never wrong bytes; the rest keeps serving; both recover."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import torch
from conftest import expected_tensor, fill_obj, make_config, make_key
from redis_servers import RedisClusterProcs, RedisServer, make_redis_backend

from lmcache.utils import CacheEngineKey
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.redis_backend import RedisBackend

pytestmark = pytest.mark.redis

TIMEOUT_S = 0.5
CONNECT_TIMEOUT_S = 0.5
RETRY_S = 0.3
# A hung call must wait for its socket timeout (that is the proof it was hung, not
# refused) and not much longer; the slack is for a loaded 2-core CI runner.
SLACK_S = 1.5


@pytest.fixture
def cpu() -> Any:
    backend = LocalCPUBackend(make_config(max_local_cpu_size="8MiB", local_cpu=False))
    yield backend
    backend.close()


def _tier(url: str, cpu: LocalCPUBackend, cluster: bool = False) -> RedisBackend:
    tier: RedisBackend = make_redis_backend(
        url,
        cpu,
        cluster=cluster,
        timeout_s=TIMEOUT_S,
        connect_timeout_s=CONNECT_TIMEOUT_S,
        retry_interval_s=RETRY_S,
    )
    return tier


def _put_all(tier: RedisBackend, cpu: LocalCPUBackend, keys: list[CacheEngineKey]) -> None:
    for key in keys:
        obj = fill_obj(cpu, key.chunk_hash)
        for future in tier.batched_submit_put_task([key], [obj]) or []:
            future.result()
        obj.ref_count_down()
    assert tier.get_stats()["puts"] == len(keys)


def _timed(call: Any) -> tuple[Any, float]:
    start = time.monotonic()
    result = call()
    return result, time.monotonic() - start


def _read(tier: RedisBackend, key: CacheEngineKey) -> torch.Tensor | None:
    obj = tier.get_blocking(key)
    if obj is None:
        return None
    value = obj.tensor.clone()
    obj.ref_count_down()
    return value


def test_hung_redis_is_a_miss_within_the_socket_timeout(
    own_redis_server: RedisServer, cpu: LocalCPUBackend
) -> None:
    tier = _tier(own_redis_server.url, cpu)
    key = make_key(1)
    _put_all(tier, cpu, [key])
    assert tier.contains(key)
    own_redis_server.pause()
    try:
        hits, elapsed = _timed(lambda: tier.batched_contains([key]))
        assert hits == 0  # a miss, not an exception
        assert TIMEOUT_S * 0.9 <= elapsed < TIMEOUT_S + SLACK_S, elapsed
        assert not tier.available
        # While it is known to be hung, calls cost nothing until the next probe.
        got, elapsed = _timed(lambda: tier.get_blocking(key))
        assert got is None and elapsed < TIMEOUT_S * 0.5, elapsed
        time.sleep(RETRY_S * 1.2)
        # The asyncio path (a fresh client per call off the server loop) is bounded too.
        hits, elapsed = _timed(lambda: asyncio.run(tier.batched_async_contains("h", [key])))
        assert hits == 0
        assert elapsed < CONNECT_TIMEOUT_S + TIMEOUT_S + SLACK_S, elapsed
    finally:
        own_redis_server.resume()
    deadline = time.monotonic() + 10
    while not tier.contains(key) and time.monotonic() < deadline:
        time.sleep(RETRY_S / 3)
    assert tier.available
    value = _read(tier, key)
    assert value is not None and torch.equal(value, expected_tensor(1))
    assert tier.get_stats()["outages"] >= 1
    tier.close()


def _owner_ports(
    cluster: RedisClusterProcs, tier: RedisBackend, keys: list[CacheEngineKey]
) -> list[int]:
    from redis.cluster import RedisCluster

    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        return [client.get_node_from_key(tier.redis_key(k)).port for k in keys]
    finally:
        client.close()


def test_dead_cluster_node_only_misses_its_own_keys(
    own_redis_cluster: RedisClusterProcs, cpu: LocalCPUBackend
) -> None:
    tier = _tier(own_redis_cluster.url, cpu, cluster=True)
    keys = [make_key(i) for i in range(30)]
    _put_all(tier, cpu, keys)
    owners = _owner_ports(own_redis_cluster, tier, keys)
    dead = own_redis_cluster.nodes[1]
    on_dead = [k for k, port in zip(keys, owners) if port == dead.port]
    elsewhere = [k for k, port in zip(keys, owners) if port != dead.port]
    assert on_dead and elsewhere, "the keys should spread over every shard"
    dead.kill()
    for _ in range(3):  # before and after the dead shard's breaker trips and re-probes
        assert [tier.contains(k) for k in on_dead] == [False] * len(on_dead)
        assert [tier.contains(k) for k in elsewhere] == [True] * len(elsewhere)
        got = tier.batched_get_blocking(keys)
        for key, obj in zip(keys, got):
            if key in on_dead:
                assert obj is None
            else:
                assert obj is not None and torch.equal(obj.tensor, expected_tensor(key.chunk_hash))
                obj.ref_count_down()
        time.sleep(RETRY_S * 1.2)
    # Puts: the live shards take theirs; the dead shard's are counted as dropped.
    before = tier.get_stats()
    fresh = [make_key(100 + i) for i in range(12)]
    for key in fresh:
        obj = fill_obj(cpu, key.chunk_hash)
        for future in tier.batched_submit_put_task([key], [obj]) or []:
            future.result()
        obj.ref_count_down()
    after = tier.get_stats()
    fresh_owners = _owner_ports(own_redis_cluster, tier, fresh)
    landed = sum(port != dead.port for port in fresh_owners)
    assert after["puts"] - before["puts"] == landed
    assert after["puts_dropped"] - before["puts_dropped"] == len(fresh) - landed
    for key, port in zip(fresh, fresh_owners):
        assert tier.contains(key) is (port != dead.port)
    assert tier.available  # one dead shard is not a dead tier
    tier.close()
