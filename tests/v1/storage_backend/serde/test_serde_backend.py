"""Serde on real L2 tiers: chunks round-trip through a disk tier and a Redis tier built
from ``--l2-adapter`` JSON, serde runs only on L1->L2 puts and L2->L1 reads (never on an
L1 hit), and a tier read without the serde, or with another, or holding altered bytes,
misses instead of returning foreign KV."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from prerequisites import require_module

from lmcache.utils import CacheEngineKey
from lmcache.v1.storage_backend.cache_salt import configs_with_salt
from lmcache.v1.storage_backend.serde import SerdeBackend
from lmcache.v1.storage_backend.serde.backend import blob_object
from lmcache.v1.storage_backend.serde.chunk_serde import ChunkSerde
from lmcache.v1.storage_backend.storage_manager import StorageManager, create_storage_backends
from lmcache.v1.storage_backend.tier_settings import TierSettings

require_module(
    "cryptography", "the aesgcm serde needs cryptography (pip install 'lmcache-core[encryption]')"
)

SHAPE = torch.Size([2, 2, 16, 32])
KEY_ENV = "LMC_TEST_SERDE_BACKEND_KEY"


@pytest.fixture(autouse=True)
def _master_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, os.urandom(32).hex())


AES = {"type": "aesgcm", "master_key_env": KEY_ENV}
SERDES = {
    "fp8": {"type": "fp8"},
    "asym_k16_v8": {"type": "asym_k16_v8"},
    "aesgcm": AES,
    "multi": {"type": "multi", "serdes": [{"type": "fp8", "fp8_dtype": "float8_e5m2"}, AES]},
}
# |x - x'| <= rel * |x| + abs per serde (docs/storage.md; exact for aesgcm).
BOUNDS = {
    "fp8": (2.0**-4, 2.0**-10),
    "asym_k16_v8": (2.0**-4 + 2.0**-11, 1e-4),
    "aesgcm": (0.0, 0.0),
    "multi": (2.0**-3, 2.0**-17),
}


def within(name: str, got: torch.Tensor, values: torch.Tensor) -> bool:
    rel, abs_ = BOUNDS[name]
    err = (got.float() - values.float()).abs()
    return bool((err <= rel * values.float().abs() + abs_).all())


def key(i: int, salt: str = "tenant-a") -> CacheEngineKey:
    return CacheEngineKey("org/model", 1, 0, i, torch.half, configs_with_salt(None, salt))


def manager(adapters: list[dict[str, Any]], l1_gb: float = 0.004) -> StorageManager:
    settings = TierSettings.from_server_flags(
        chunk_size=16,
        l1_size_gb=l1_gb,
        eviction_policy="LRU",
        blocking_timeout_secs=1,
        l2_adapters=[json.dumps(a) for a in adapters],
    )
    return StorageManager(backends=create_storage_backends(settings))


def put(m: StorageManager, k: CacheEngineKey, seed: int) -> torch.Tensor:
    obj = m.allocate(SHAPE, torch.half)
    assert obj is not None and obj.tensor is not None
    values = torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed)).half()
    obj.tensor.copy_(values)
    m.batched_submit_put_task([k], [obj])
    m.wait_for_puts()
    obj.ref_count_down()
    return values


def l2(m: StorageManager) -> SerdeBackend:
    tier = next(b for name, b in m.storage_backends.items() if name != "LocalCPUBackend")
    assert isinstance(tier, SerdeBackend)
    return tier


def read_l2(m: StorageManager, k: CacheEngineKey) -> torch.Tensor | None:
    obj = l2(m).get_blocking(k)
    if obj is None:
        return None
    assert obj.tensor is not None
    out = obj.tensor.clone()
    obj.ref_count_down()
    return out


@pytest.fixture
def disk_adapter(tmp_path: Path) -> Iterator[dict[str, Any]]:
    yield {"type": "disk", "path": str(tmp_path / "l2"), "size_gb": 0.01}


@pytest.mark.parametrize("name", sorted(SERDES))
def test_disk_tier_round_trip(name: str, disk_adapter: dict[str, Any]) -> None:
    m = manager([{**disk_adapter, "serde": SERDES[name]}])
    try:
        values = put(m, key(1), seed=1)
        got = read_l2(m, key(1))
        assert got is not None
        assert within(name, got, values)
        if name == "aesgcm":
            assert torch.equal(got, values)
        # What the disk holds is the serde's output, not the chunk.
        stored = l2(m).inner.get_blocking(l2(m).serde.stored_key(key(1)))
        assert stored is not None
        assert bytes(stored.byte_array[:4]) == b"LMSE"
        if name == "fp8":
            assert stored.get_size() < values.numel() * 2 * 0.6
        stored.ref_count_down()
    finally:
        m.close()


def test_disk_tier_survives_restart(disk_adapter: dict[str, Any]) -> None:
    spec = {**disk_adapter, "serde": SERDES["multi"]}
    m = manager([spec])
    values = put(m, key(2), seed=2)
    m.close()
    m = manager([spec])
    try:
        got = read_l2(m, key(2))
        assert got is not None
        assert within("multi", got, values)
    finally:
        m.close()


def test_redis_tier_round_trip(redis_server: Any) -> None:
    adapter = {
        "type": "resp",
        "url": redis_server.url,
        "namespace": f"serde-{os.getpid()}-{id(redis_server)}",
        "serde": SERDES["multi"],
    }
    m = manager([adapter])
    try:
        values = put(m, key(3), seed=3)
        got = read_l2(m, key(3))
        assert got is not None
        assert within("multi", got, values)
        assert read_l2(m, key(4)) is None
    finally:
        m.close()


class CountingSerde(ChunkSerde):
    """The real serde, counting its calls."""

    def __init__(self, inner: ChunkSerde) -> None:
        super().__init__(inner.tensor_stage, inner.byte_stages)
        self.encodes = 0
        self.decodes = 0

    def encode(self, key: Any, obj: Any) -> bytearray:
        self.encodes += 1
        return super().encode(key, obj)

    def decode(self, key: Any, blob: Any, allocate: Any) -> Any:
        self.decodes += 1
        return super().decode(key, blob, allocate)


def test_serde_runs_on_l2_writes_and_reads_never_on_l1_hits(
    disk_adapter: dict[str, Any],
) -> None:
    m = manager([{**disk_adapter, "serde": SERDES["fp8"]}])
    try:
        tier = l2(m)
        counting = CountingSerde(tier.serde)
        tier.serde = counting
        put(m, key(5), seed=5)
        assert (counting.encodes, counting.decodes) == (1, 0)  # the L1->L2 write
        for _ in range(3):  # L1 hits
            obj = m.get_blocking(key(5))
            assert obj is not None
            obj.ref_count_down()
            assert m.batched_contains([key(5)]) == 1
        assert (counting.encodes, counting.decodes) == (1, 0)
        m.local_cpu_backend.remove(key(5))  # now only L2 has it
        obj = m.get_blocking(key(5))
        assert obj is not None
        obj.ref_count_down()
        assert (counting.encodes, counting.decodes) == (1, 1)  # the L2->L1 read
        obj = m.get_blocking(key(5))  # promoted: an L1 hit again
        assert obj is not None
        obj.ref_count_down()
        assert (counting.encodes, counting.decodes) == (1, 1)
    finally:
        m.close()


def test_put_neither_encodes_nor_asks_the_tier_on_the_callers_thread(
    disk_adapter: dict[str, Any],
) -> None:
    import threading

    m = manager([{**disk_adapter, "serde": SERDES["fp8"]}])
    try:
        tier = l2(m)
        threads: list[str] = []
        real = tier.serde.encode

        def spy(k: Any, obj: Any) -> bytearray:
            threads.append(threading.current_thread().name)
            return real(k, obj)

        tier.serde.encode = spy  # type: ignore[method-assign]
        asked: list[str] = []
        contains = tier.inner.contains

        def contains_spy(k: Any, pin: bool = False) -> bool:
            asked.append(threading.current_thread().name)
            return contains(k, pin=pin)

        tier.inner.contains = contains_spy  # type: ignore[method-assign]
        put(m, key(6), seed=6)
        assert threads and all(t.startswith("lmc-serde") for t in threads)
        # Nor asks the tier anything there (a Redis round trip per put).
        assert asked and all(t.startswith("lmc-serde") for t in asked)
    finally:
        m.close()


def test_tier_without_or_with_another_serde_misses(disk_adapter: dict[str, Any]) -> None:
    m = manager([{**disk_adapter, "serde": SERDES["fp8"]}])
    put(m, key(7), seed=7)
    m.close()
    for other in (None, SERDES["asym_k16_v8"], {"type": "fp8", "fp8_dtype": "float8_e5m2"}):
        spec = dict(disk_adapter) if other is None else {**disk_adapter, "serde": other}
        m = manager([spec])
        try:
            tier = next(b for n, b in m.storage_backends.items() if n != "LocalCPUBackend")
            assert not tier.contains(key(7))
            assert tier.get_blocking(key(7)) is None
            assert m.get_blocking(key(7)) is None
        finally:
            m.close()


def test_altered_chunk_is_a_miss_and_removed(disk_adapter: dict[str, Any]) -> None:
    m = manager([{**disk_adapter, "serde": SERDES["aesgcm"]}])
    try:
        put(m, key(8), seed=8)
        tier = l2(m)
        stored_key = tier.serde.stored_key(key(8))
        stored = tier.inner.get_blocking(stored_key)
        assert stored is not None
        blob = bytearray(stored.byte_array)
        stored.ref_count_down()
        blob[-20] ^= 0x01
        # Re-stored through the tier itself, so its own checksums are valid: only the
        # serde can tell.
        tier.inner.remove(stored_key)
        altered = blob_object(bytes(blob))
        for future in tier.inner.batched_submit_put_task([stored_key], [altered]) or []:
            future.result()
        tier.inner.wait_for_puts()  # type: ignore[attr-defined]
        m.local_cpu_backend.remove(key(8))
        assert m.get_blocking(key(8)) is None
        assert tier.serde_errors == 1
        assert not tier.contains(key(8))
    finally:
        m.close()


def test_wrapper_reports_the_inner_tier(disk_adapter: dict[str, Any]) -> None:
    m = manager([{**disk_adapter, "serde": SERDES["fp8"]}])
    try:
        put(m, key(9), seed=9)
        tier = l2(m)
        assert tier.path == disk_adapter["path"]
        assert tier.used_bytes > 0 and len(tier) == 1
        assert tier.evictions == 0 and tier.health_problems() == []
        assert m.lookup_location(key(9)) == "LocalCPUBackend"
    finally:
        m.close()


def test_a_full_serde_queue_drops_puts_instead_of_growing(disk_adapter: dict[str, Any]) -> None:
    import threading

    m = manager([{**disk_adapter, "serde": SERDES["fp8"]}])
    try:
        tier = l2(m)
        gate = threading.Event()
        real = tier.serde.encode

        def slow(k: Any, obj: Any) -> bytearray:
            gate.wait(10)
            return real(k, obj)

        tier.serde.encode = slow  # type: ignore[method-assign]
        tier._puts = type(tier._puts)(limit=2)
        objs = []
        for _ in range(4):
            obj = m.allocate(SHAPE, torch.half)
            assert obj is not None
            objs.append(obj)
        m.batched_submit_put_task([key(20 + i) for i in range(4)], objs)
        assert tier.dropped_puts == 2
        gate.set()
        m.wait_for_puts()
        for obj in objs:
            obj.ref_count_down()
        assert [tier.contains(key(20 + i)) for i in range(4)] == [True, True, False, False]
    finally:
        m.close()
