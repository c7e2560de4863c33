"""A hung Redis (SIGSTOP) and a dead cluster node: lookups are misses within the socket
timeout, never exceptions, never wrong bytes; the rest keeps serving; both recover.

Every call against a hung Redis runs under its own deadline (:func:`_bounded`), so a
regression fails here with the call that hung, never through pytest's global timeout."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

import pytest
import torch
from conftest import expected_tensor, fill_obj, make_config, make_key
from redis_servers import RedisClusterProcs, RedisServer, make_redis_backend

from lmcache.utils import CacheEngineKey
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.redis_backend import RedisBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager

pytestmark = pytest.mark.redis

TIMEOUT_S = 0.5
CONNECT_TIMEOUT_S = 0.5
RETRY_S = 0.3
# A hung call must wait for its socket timeout (that is the proof it was hung, not
# refused) and not much longer; the slack is for a loaded 2-core CI runner.
SLACK_S = 1.5
# No call may take longer than this (a connection from the pool, a connect, one command).
CALL_DEADLINE_S = CONNECT_TIMEOUT_S + 2 * TIMEOUT_S + SLACK_S


@pytest.fixture
def cpu() -> Any:
    backend = LocalCPUBackend(make_config(max_local_cpu_size="8MiB", local_cpu=False))
    yield backend
    backend.close()


def _tier(url: str, cpu: LocalCPUBackend, cluster: bool = False, **options: Any) -> RedisBackend:
    values: dict[str, Any] = {
        "timeout_s": TIMEOUT_S,
        "connect_timeout_s": CONNECT_TIMEOUT_S,
        "retry_interval_s": RETRY_S,
    }
    tier: RedisBackend = make_redis_backend(url, cpu, cluster=cluster, **(values | options))
    return tier


def _bounded(call: Any, deadline_s: float = CALL_DEADLINE_S) -> tuple[Any, float]:
    """``call()`` on a daemon thread, with its result and duration; an assertion error
    (not a hang) if it has not returned within ``deadline_s``."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:
            outcome["error"] = exc

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True, name="bounded-call")
    thread.start()
    thread.join(deadline_s)
    elapsed = time.monotonic() - start
    assert not thread.is_alive(), f"{call} still blocked after {deadline_s:.1f}s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"], elapsed


def _put_all(tier: RedisBackend, cpu: LocalCPUBackend, keys: list[CacheEngineKey]) -> None:
    for key in keys:
        obj = fill_obj(cpu, key.chunk_hash)
        for future in tier.batched_submit_put_task([key], [obj]) or []:
            future.result()
        obj.ref_count_down()
    assert tier.get_stats()["puts"] == len(keys)


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
        hits, elapsed = _bounded(lambda: tier.batched_contains([key]))
        assert hits == 0  # a miss, not an exception
        assert TIMEOUT_S * 0.9 <= elapsed < TIMEOUT_S + SLACK_S, elapsed
        assert not tier.available
        # While it is known to be hung, calls cost nothing until the next probe.
        got, elapsed = _bounded(lambda: tier.get_blocking(key))
        assert got is None and elapsed < TIMEOUT_S * 0.5, elapsed
        time.sleep(RETRY_S * 1.2)
        # The asyncio path (a fresh client per call off the server loop) is bounded too.
        hits, elapsed = _bounded(lambda: asyncio.run(tier.batched_async_contains("h", [key])))
        assert hits == 0
        assert elapsed < CONNECT_TIMEOUT_S + TIMEOUT_S + SLACK_S, elapsed
    finally:
        own_redis_server.resume()
    deadline = time.monotonic() + 10
    while not _bounded(lambda: tier.contains(key))[0] and time.monotonic() < deadline:
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


def _hammer(calls: list[Any], window_s: float) -> list[tuple[float, float]]:
    """Run each of ``calls`` in a loop on its own thread for ``window_s``; the (start, end)
    of every call.  Threads still running a call past the window plus one call's deadline
    are an assertion error, not a hang."""
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + window_s

    def loop(call: Any) -> None:
        while time.monotonic() < stop_at:
            start = time.monotonic()
            call()
            with lock:
                spans.append((start, time.monotonic()))

    threads = [threading.Thread(target=loop, args=(c,), daemon=True) for c in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, stop_at - time.monotonic()) + CALL_DEADLINE_S)
    assert not any(t.is_alive() for t in threads), "a call against the hung Redis never returned"
    return sorted(spans)


def test_hung_redis_holds_at_most_one_call_per_probe_interval(
    own_redis_server: RedisServer, cpu: LocalCPUBackend
) -> None:
    """The breaker opens on the first timeout; after that, one half-open probe at a time
    waits the socket timeout and every other call fails fast: no two slow calls overlap
    and slow calls start at least a probe interval apart."""
    # The interval below the socket timeout, as in the defaults (1 s and 2 s): before the
    # fix a second probe started while the first still hung.
    timeout_s, retry_s, window_s = 0.6, 0.3, 4.0
    tier = _tier(own_redis_server.url, cpu, timeout_s=timeout_s, retry_interval_s=retry_s)
    keys = [make_key(1), make_key(2)]
    _put_all(tier, cpu, keys)
    own_redis_server.pause()
    try:
        spans = _hammer(
            [
                lambda: tier.batched_contains(keys),
                lambda: tier.batched_contains(keys[:1]),
                lambda: tier.get_blocking(keys[1]),
                lambda: tier.contains(keys[0]),
            ],
            window_s,
        )
    finally:
        own_redis_server.resume()
    longest = max(end - start for start, end in spans)
    assert longest < timeout_s + SLACK_S, longest  # no call waited past its socket timeout
    slow = [(s, e) for s, e in spans if e - s >= timeout_s * 0.8]
    assert slow, "the hung Redis should have cost the first calls their socket timeout"
    opened = min(e for _, e in slow)  # the first timeout opened the breaker
    probes = [(s, e) for s, e in slow if s >= opened]
    for (s1, e1), (s2, _) in itertools.pairwise(probes):
        assert s2 >= e1, f"two calls waited for the hung Redis at once: {probes}"
        assert s2 - s1 >= retry_s, f"slow calls closer than one probe interval: {probes}"
    assert len(probes) <= window_s / (timeout_s + retry_s) + 1, probes
    fast = [(s, e) for s, e in spans if s >= opened and e - s < timeout_s * 0.5]
    assert len(fast) > 10 * max(1, len(probes)), "calls should fail fast while open"
    tier.close()


def test_puts_to_a_hung_redis_never_block_and_a_full_queue_drops(
    own_redis_server: RedisServer, cpu: LocalCPUBackend, caplog: pytest.LogCaptureFixture
) -> None:
    queue = 8
    tier = _tier(own_redis_server.url, cpu, put_queue_chunks=queue, put_workers=1)
    keys = [make_key(1000 + i) for i in range(5 * queue)]
    objs = [fill_obj(cpu, k.chunk_hash) for k in keys]
    own_redis_server.pause()
    try:
        with caplog.at_level(logging.WARNING):

            def submit_all() -> None:
                for key, obj in zip(keys, objs):
                    tier.batched_submit_put_task([key], [obj])

            _, elapsed = _bounded(submit_all)
        # Never waited for the hung Redis (one socket timeout would be TIMEOUT_S).
        assert elapsed < TIMEOUT_S, elapsed
        stats = tier.get_stats()
        assert stats["puts_queue_full"] >= len(keys) - queue, stats
        full_lines = [r for r in caplog.records if "put queue full" in r.getMessage()]
        assert len(full_lines) == 1, [r.getMessage() for r in full_lines]  # rate-limited
    finally:
        own_redis_server.resume()
    _bounded(tier.wait_for_puts)
    stats = tier.get_stats()
    assert stats["puts"] + stats["puts_dropped"] == len(keys), stats
    for obj in objs:
        obj.ref_count_down()
    tier.close()


def test_storage_manager_hands_puts_to_the_redis_queue_without_waiting(
    own_redis_server: RedisServer, cpu: LocalCPUBackend
) -> None:
    """Write-through to Redis goes straight into the tier's bounded queue: a hung Redis
    neither blocks the caller nor piles puts up behind the manager's writer thread."""
    queue = 4
    tier = _tier(own_redis_server.url, cpu, put_queue_chunks=queue, put_workers=1)
    backends: OrderedDict[str, StorageBackendInterface] = OrderedDict()
    backends["LocalCPUBackend"] = cpu
    backends["RedisBackend"] = tier
    manager = StorageManager(make_config(), backends=backends)
    keys = [make_key(2000 + i) for i in range(6 * queue)]
    own_redis_server.pause()
    try:

        def store_all() -> None:
            for key in keys:
                obj = fill_obj(cpu, key.chunk_hash)
                manager.batched_submit_put_task([key], [obj])
                obj.ref_count_down()

        _, elapsed = _bounded(store_all)
        assert elapsed < TIMEOUT_S, elapsed
        # Handed over at once: the queue overflowed right away.
        assert tier.get_stats()["puts_queue_full"] >= len(keys) - queue - 1
    finally:
        own_redis_server.resume()
    _bounded(manager.wait_for_puts)
    manager.close()
