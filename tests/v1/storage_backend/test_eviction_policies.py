"""Eviction policies on the real tiers: names, and properties that hold for every policy.

* pinned objects and objects a reader still holds are never evicted;
* a tier never holds more than its capacity, and its per-tenant byte counts always add
  up to what it holds;
* ``noop`` never evicts (a full tier refuses new data at once);
* ARC beats LRU on a scan-polluted trace run through the CPU tier;
* ``IsolatedLRU`` takes room only from tenants over their quota while any is.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import OBJ_DTYPE, OBJ_SHAPE, make_config, put
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import CACHE_POLICIES, ConfigError, LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.cache_policy import (
    ARCCachePolicy,
    IsolatedLRUCachePolicy,
    get_cache_policy,
    policy_names,
)
from lmcache.v1.storage_backend.cache_salt import configs_with_salt, salt_of
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
from lmcache.v1.storage_backend.quota import QuotaManager, SaltUsage

SLOT = 4096  # one test object (conftest.OBJ_SHAPE of half)
SALTS = ("", "alice", "bob")


def salted_key(i: int, salt: str = "") -> CacheEngineKey:
    return CacheEngineKey("org/model", 1, 0, i, OBJ_DTYPE, configs_with_salt(None, salt))


# -- names ------------------------------------------------------------------------------------


def test_every_documented_name_builds_its_policy_in_any_case() -> None:
    assert policy_names() == list(CACHE_POLICIES)
    assert set(CACHE_POLICIES) >= {"LRU", "ARC", "IsolatedLRU", "noop", "FIFO", "LFU", "MRU"}
    for name in CACHE_POLICIES:
        for spelling in (name, name.lower(), name.upper()):
            assert type(get_cache_policy(spelling)) is type(get_cache_policy(name))
    with pytest.raises(ValueError, match="IsolatedLRU"):
        get_cache_policy("random")


def test_config_key_takes_upstream_names_in_any_case_and_keeps_their_spelling() -> None:
    config = LMCacheEngineConfig.from_dict({"cache_policy": "isolatedlru"})
    assert config.cache_policy == "IsolatedLRU"
    assert LMCacheEngineConfig.from_dict({"cache_policy": "NOOP"}).cache_policy == "noop"
    with pytest.raises(ConfigError, match="ARC"):
        LMCacheEngineConfig.from_dict({"cache_policy": "clock"})


# -- properties on the CPU tier ---------------------------------------------------------------

KEYS = 10
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, KEYS - 1), st.sampled_from(SALTS)),
        st.tuples(st.sampled_from(["get", "pin", "unpin", "remove"]), st.integers(0, KEYS - 1)),
        st.tuples(st.just("release")),
    ),
    max_size=40,
)
PROPERTY_SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class CPUModel:
    """Drives one CPU tier and remembers what may not leave it."""

    def __init__(self, policy: str) -> None:
        # Four slots, tiny timeouts: a full tier of pinned objects refuses quickly.
        self.cpu = LocalCPUBackend(make_config(max_local_cpu_size="16KiB", cache_policy=policy))
        self.cpu.quota_manager.set_quota("alice", 2 * SLOT)
        self.pins: Counter[CacheEngineKey] = Counter()
        self.held: list[tuple[CacheEngineKey, MemoryObj]] = []
        self.ever_stored: set[CacheEngineKey] = set()
        self.removed = 0

    def apply(self, op: tuple[Any, ...]) -> None:
        cpu = self.cpu
        if op[0] == "put":
            key = salted_key(op[1], op[2])
            obj = cpu.allocate(OBJ_SHAPE, OBJ_DTYPE, busy_loop=False)
            if obj is not None:
                cpu.batched_submit_put_task([key], [obj])
                obj.ref_count_down()
                if cpu.contains(key):
                    self.ever_stored.add(key)
            return
        if op[0] == "release":
            if self.held:
                self.held.pop(0)[1].ref_count_down()
            return
        key = salted_key(op[1])
        if op[0] == "get":
            obj = cpu.get_blocking(key)
            if obj is not None:
                self.held.append((key, obj))
        elif op[0] == "pin":
            if cpu.pin(key):
                self.pins[key] += 1
        elif op[0] == "unpin":
            if self.pins[key] and cpu.unpin(key):
                self.pins[key] -= 1
        elif op[0] == "remove" and cpu.remove(key, force=False):
            self.removed += 1
            assert not self.pins[key] and key not in dict(self.held)

    def check(self, policy: str) -> None:
        cpu = self.cpu
        for key, count in self.pins.items():
            assert not count or cpu.contains(key), f"{policy} evicted a pinned object"
        for key, _obj in self.held:
            assert cpu.contains(key), f"{policy} evicted an object a reader holds"
        resident = {key: cpu._hot[key].get_physical_size() for key in cpu.get_keys()}
        assert sum(resident.values()) <= cpu.capacity_bytes
        assert cpu.used_bytes <= cpu.capacity_bytes
        by_salt: Counter[str] = Counter()
        for key, size in resident.items():
            by_salt[salt_of(key)] += size
        assert cpu.salt_usage.bytes_by_salt() == dict(by_salt)
        assert len(cpu._policy) == len(resident)
        if policy == "noop":
            assert cpu.evictions == 0
            assert len(self.ever_stored) - self.removed == len(resident)

    def close(self) -> None:
        for _key, obj in self.held:
            obj.ref_count_down()
        self.cpu.close()


@pytest.mark.parametrize("policy", CACHE_POLICIES)
@PROPERTY_SETTINGS
@given(ops=OPS)
def test_cpu_tier_keeps_pinned_and_read_objects_and_its_capacity(
    policy: str, ops: list[tuple[Any, ...]]
) -> None:
    model = CPUModel(policy)
    try:
        for op in ops:
            model.apply(op)
            model.check(policy)
    finally:
        model.close()


# -- properties on the disk tier --------------------------------------------------------------


@pytest.mark.parametrize("policy", CACHE_POLICIES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["put", "put", "pin", "unpin"]),
            st.integers(0, KEYS - 1),
            st.sampled_from(SALTS),
        ),
        max_size=25,
    )
)
def test_disk_tier_keeps_pinned_files_and_its_capacity(
    tmp_path_factory: pytest.TempPathFactory, policy: str, ops: list[tuple[str, int, str]]
) -> None:
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    folder = tmp_path_factory.mktemp("disk")
    config = make_config(
        local_disk=str(folder),
        max_local_disk_size="20KiB",  # four files and their headers
        cache_policy=policy,
        extra_config={"local_disk.fsync": False},
    )
    disk = LocalDiskBackend(config, cpu)
    pins: Counter[CacheEngineKey] = Counter()
    try:
        for op, i, salt in ops:
            key = salted_key(i, salt)
            if op == "put":
                put(disk, key, i)
            elif op == "pin" and disk.pin(key):
                pins[key] += 1
            elif op == "unpin" and pins[key] and disk.unpin(key):
                pins[key] -= 1
            assert disk.used_bytes <= disk.capacity_bytes
            for pinned, count in pins.items():
                assert not count or disk.contains(pinned), f"{policy} evicted a pinned file"
            sizes = {k: disk._index[k].file_size for k in disk.get_keys()}
            assert disk.salt_usage.total_bytes() == sum(sizes.values())
            if policy == "noop":
                assert disk.evictions == 0
    finally:
        disk.close()
        cpu.close()


# -- noop -------------------------------------------------------------------------------------


def test_noop_full_tier_refuses_at_once_and_keeps_everything() -> None:
    cpu = LocalCPUBackend(
        make_config(max_local_cpu_size="16KiB", cache_policy="noop", blocking_timeout_secs=5)
    )
    try:
        for i in range(4):
            put(cpu, salted_key(i), i)
        start = time.monotonic()
        assert cpu.allocate(OBJ_SHAPE, OBJ_DTYPE) is None  # busy_loop=True
        assert time.monotonic() - start < 1.0  # no wait for room that cannot come
        assert all(cpu.contains(salted_key(i)) for i in range(4))
        assert cpu.evictions == 0
        assert cpu.remove(salted_key(0))  # explicit removal still frees room
        assert cpu.allocate(OBJ_SHAPE, OBJ_DTYPE, busy_loop=False) is not None
    finally:
        cpu.close()


# -- ARC --------------------------------------------------------------------------------------


def scan_polluted_trace(seed: int, rounds: int = 12) -> list[int]:
    """A hot working set (48 chunks, reused at random) interleaved with one-pass scans of
    100 chunks never seen again: long unrelated prompts streaming through a shared cache."""
    rng = random.Random(seed)
    trace: list[int] = []
    fresh = 10**6
    for _ in range(rounds):
        trace += [rng.randrange(48) for _ in range(200)]
        trace += range(fresh, fresh + 100)
        fresh += 100
    return trace


def hit_rate_through_cpu_tier(policy: str, trace: list[int]) -> float:
    """Replays ``trace`` on a 64-object CPU tier: a hit is a get that finds the chunk; a
    miss stores it (evicting as the policy says)."""
    cpu = LocalCPUBackend(make_config(max_local_cpu_size=f"{64 * 4}KiB", cache_policy=policy))
    hits = 0
    try:
        for i in trace:
            obj = cpu.get_blocking(salted_key(i))
            if obj is not None:
                hits += 1
                obj.ref_count_down()
            else:
                put(cpu, salted_key(i), i % 1000)
    finally:
        cpu.close()
    return hits / len(trace)


def test_arc_beats_lru_on_a_scan_polluted_trace() -> None:
    trace = scan_polluted_trace(seed=7)
    lru = hit_rate_through_cpu_tier("LRU", trace)
    arc = hit_rate_through_cpu_tier("ARC", trace)
    # Measured 0.51 (LRU) and 0.65 (ARC); the ceiling is 200/300 = 0.67.
    assert arc >= lru + 0.10, (arc, lru)


def test_arc_learns_from_ghosts_and_forgets_explicit_removals() -> None:
    arc = ARCCachePolicy(capacity=2)
    arc.on_put("a")
    arc.on_put("b")
    arc.on_hit("b")  # b: seen twice -> T2
    assert arc.lists()["t1"] == ["a"] and arc.lists()["t2"] == ["b"]
    victim = next(iter(arc.candidates()))
    assert victim == "a"  # T1 at or above its target (0): the recent-only key goes first
    arc.on_evict("a")
    assert arc.lists()["b1"] == ["a"]
    arc.on_put("a")  # a ghost hit in B1: T1 deserved more room
    assert arc.target_t1_size >= 1 and "a" in arc.lists()["t2"]
    arc.on_remove("b")
    assert all("b" not in keys for keys in arc.lists().values())  # no ghost either


# -- IsolatedLRU ------------------------------------------------------------------------------


def test_isolated_lru_takes_room_only_from_the_tenant_over_quota() -> None:
    cpu = LocalCPUBackend(make_config(max_local_cpu_size="32KiB", cache_policy="IsolatedLRU"))
    try:
        cpu.quota_manager.set_quota("alice", 4 * SLOT)
        cpu.quota_manager.set_quota("bob", 2 * SLOT)
        for i in range(4):
            put(cpu, salted_key(i, "alice"), i)  # alice: at her quota, oldest data
        for i in range(10, 30):
            put(cpu, salted_key(i, "bob"), i)  # bob floods the tier, far over his
        assert all(cpu.contains(salted_key(i, "alice")) for i in range(4))
        bob_kept = [i for i in range(10, 30) if cpu.contains(salted_key(i, "bob"))]
        assert bob_kept == list(range(26, 30))  # his newest, LRU within bob
        assert cpu.salt_usage.bytes_of("alice") == 4 * SLOT
    finally:
        cpu.close()


def test_isolated_lru_tenant_without_quota_gives_up_room_first() -> None:
    # Allowlist lens (upstream's MP server): a salt without a quota has a limit of 0.
    policy = IsolatedLRUCachePolicy(QuotaManager())
    policy._quotas.set_quota("alice", 10)  # type: ignore[union-attr]
    for i in range(3):
        policy.on_put(salted_key(i, "alice"))
    policy.on_put(salted_key(9, "stranger"))
    assert next(iter(policy.candidates())) == salted_key(9, "stranger")


@PROPERTY_SETTINGS
@given(
    alice_puts=st.integers(0, 4),
    others=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["bob", ""])), max_size=30),
    quota_slots=st.integers(0, 3),
)
def test_isolated_lru_never_touches_a_tenant_within_quota_while_others_are_over(
    alice_puts: int, others: list[tuple[int, str]], quota_slots: int
) -> None:
    """Alice stays within her quota; whatever the others store, none of her chunks goes
    while the others can give up room (their chunks are never pinned here)."""
    cpu = LocalCPUBackend(make_config(max_local_cpu_size="32KiB", cache_policy="IsolatedLRU"))
    try:
        cpu.quota_manager.set_quota("alice", 4 * SLOT)
        cpu.quota_manager.set_quota("bob", quota_slots * SLOT)
        for i in range(alice_puts):
            put(cpu, salted_key(i, "alice"), i)
        for i, salt in others:
            put(cpu, salted_key(100 + i, salt), i)
            assert all(cpu.contains(salted_key(j, "alice")) for j in range(alice_puts))
            assert cpu.used_bytes <= cpu.capacity_bytes
    finally:
        cpu.close()


def test_disk_tier_shares_l1_quotas_and_counts_per_salt(tmp_path: Path) -> None:
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    config = make_config(
        local_disk=str(tmp_path), max_local_disk_size="1MiB", cache_policy="IsolatedLRU"
    )
    disk = LocalDiskBackend(config, cpu)
    try:
        assert disk.quota_manager is cpu.quota_manager
        put(disk, salted_key(1, "alice"), 1)
        put(disk, salted_key(2, "bob"), 2)
        usage = disk.salt_usage.bytes_by_salt()
        assert set(usage) == {"alice", "bob"} and usage["alice"] > SLOT
        disk.remove(salted_key(1, "alice"))
        assert "alice" not in disk.salt_usage.bytes_by_salt()
    finally:
        disk.close()
        cpu.close()


def test_isolated_lru_takes_each_over_quota_tenant_only_down_to_its_limit() -> None:
    quotas, usage = QuotaManager(), SaltUsage()
    policy = IsolatedLRUCachePolicy(quotas, usage)
    quotas.set_quota("alice", 2 * SLOT)
    quotas.set_quota("bob", 8 * SLOT)
    keys = [salted_key(i, "alice") for i in range(3)]  # alice: one chunk over
    keys += [salted_key(10, "carol")]  # carol: no quota, one chunk over
    keys += [salted_key(20 + i, "bob") for i in range(3)]  # bob: within his quota
    for key in keys:
        usage.add(key, SLOT)
        policy.on_put(key)
    order = list(policy.candidates())
    # Alice gives up one chunk (her oldest), carol hers; only then plain LRU of the rest.
    assert set(order[:2]) == {salted_key(0, "alice"), salted_key(10, "carol")}
    assert order[2:] == [salted_key(1, "alice"), salted_key(2, "alice"), *keys[4:]]
