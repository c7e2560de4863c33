"""Redis Cluster placement and prefix lookups across shards; round trips per lookup."""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import pytest
from conftest import fill_obj, make_config, make_key
from redis_servers import RedisClusterProcs, RedisServer, make_redis_backend

from lmcache.utils import CacheEngineKey
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.redis_backend import RedisBackend

pytestmark = pytest.mark.redis


def _slot(name: str) -> int:
    """Redis Cluster slot (CRC16/XMODEM of the hash tag), computed independently."""
    start = name.find("{")
    end = name.find("}", start + 1)
    if start != -1 and end > start + 1:
        name = name[start + 1 : end]
    crc = 0
    for byte in name.encode():
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc % 16384


def _put(tier: RedisBackend, cpu: LocalCPUBackend, keys: list[CacheEngineKey]) -> None:
    for key in keys:
        obj = fill_obj(cpu, key.chunk_hash % 100)
        for future in tier.batched_submit_put_task([key], [obj]) or []:
            future.result()
        obj.ref_count_down()


@pytest.fixture
def cpu() -> Any:
    backend = LocalCPUBackend(make_config(local_cpu=False))
    yield backend
    backend.close()


def test_one_chunk_one_slot(redis_cluster: RedisClusterProcs, cpu: LocalCPUBackend) -> None:
    tier = make_redis_backend(redis_cluster.url, cpu, cluster=True)
    key = make_key(0xABCDEF)
    layer_names = [tier.redis_key(k) for k in key.split_layers(4)]
    worker_names = [tier.redis_key(key.with_new_worker_id(w)) for w in range(4)]
    slots = {_slot(n) for n in [tier.redis_key(key), *layer_names, *worker_names]}
    assert len(slots) == 1
    node = redis_cluster.nodes[0]
    assert int(node.cli("CLUSTER", "KEYSLOT", tier.redis_key(key))) == slots.pop()
    tier.close()


def test_prefix_lookup_across_shards_one_round_trip_per_shard(
    redis_cluster: RedisClusterProcs, cpu: LocalCPUBackend
) -> None:
    tier = make_redis_backend(redis_cluster.url, cpu, cluster=True)
    keys = [make_key(i) for i in range(24)]
    slots = [_slot(tier.redis_key(k)) for k in keys]
    ranges = [(0, 5460), (5461, 10922), (10923, 16383)]  # redis-cli --cluster create split
    shards = {next(j for j, (lo, hi) in enumerate(ranges) if lo <= s <= hi) for s in slots}
    assert len(shards) == 3, "keys should spread over every shard"
    _put(tier, cpu, keys[:10] + keys[11:])  # a hole at 10
    before = tier.get_stats()["round_trips"]
    assert tier.batched_contains(keys) == 10
    assert tier.get_stats()["round_trips"] - before == 3
    assert tier.batched_contains(keys[11:]) == 13
    assert tier.batched_contains(keys[10:]) == 0
    assert asyncio.run(tier.batched_async_contains("r", keys)) == 10
    got = tier.batched_get_blocking(keys)
    assert [o is not None for o in got] == [i != 10 for i in range(24)]
    for obj in got:
        if obj is not None:
            obj.ref_count_down()
    assert tier.batched_remove(keys) == 23
    tier.close()


def test_single_node_prefix_lookup_is_one_round_trip(
    redis_server: RedisServer, cpu: LocalCPUBackend
) -> None:
    tier = make_redis_backend(redis_server.url, cpu)
    keys = [make_key(i) for i in range(64)]
    _put(tier, cpu, keys[:40])
    for probe, hits in ((keys, 40), (keys[:40], 40), (keys[40:], 0), (keys[:1], 1)):
        before = tier.get_stats()["round_trips"]
        assert tier.batched_contains(probe) == hits
        assert tier.get_stats()["round_trips"] - before == 1
    before = tier.get_stats()["round_trips"]
    got = tier.batched_get_blocking(keys[:40])
    assert tier.get_stats()["round_trips"] - before == 1
    for obj in got:
        assert obj is not None
        obj.ref_count_down()
    tier.batched_remove(keys)
    tier.close()


def test_crc_helper_matches_redis(redis_cluster: RedisClusterProcs) -> None:
    node = redis_cluster.nodes[0]
    for name in ("plain", "a{tag}b", "{}x", f"k{zlib.crc32(b'x')}"):
        assert int(node.cli("CLUSTER", "KEYSLOT", name)) == _slot(name)
