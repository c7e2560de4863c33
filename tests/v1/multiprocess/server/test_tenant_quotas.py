"""A tenant's ``quota_bytes`` (--tenants-file) is registered in the per-salt quota
registry: a tenant over its quota evicts only its own chunks (``IsolatedLRU``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from auth_helpers import CHUNK, GEO, KeyRing, keyed, make_keyring
from mp_server_helpers import make_kv

from lmcache.v1.multiprocess.server import build_cache_server
from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

CHUNK_BYTES = 2 * GEO["num_layers"] * CHUNK * GEO["num_heads"] * GEO["head_size"] * 2
L1_CHUNKS = 64
TENANTS = f"""
tenants:
  team-a:
    keys: [alice]
    salts: [a]
    quota_bytes: {4 * CHUNK_BYTES}
  team-b:
    keys: [bob]
    salts: [b]
    quota_bytes: {CHUNK_BYTES}
"""


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> KeyRing:
    root = tmp_path_factory.mktemp("quota-keys")
    ring = make_keyring(root, ("alice", "bob"))
    (root / "tenants.yaml").write_text(TENANTS)
    return ring


def _prompt(i: int) -> list[int]:
    return [1000 * i + t for t in range(2 * CHUNK)]


def _worker(ring: KeyRing, url: str, who: str) -> KVCacheWorker:
    kv = make_kv(seed=len(who), **GEO)
    return KVCacheWorker(
        kv, model_name="m", server_url=url, mode="engine_driven", sub_path="inline",
        curve=ring.client(who),
    )  # fmt: skip


def test_a_tenant_over_quota_evicts_only_its_own_chunks(ring: KeyRing) -> None:
    tenants = str(ring.root / "tenants.yaml")
    with keyed(
        ring,
        tenants_file=tenants,
        eviction_policy="IsolatedLRU",
        l1_size_gb=L1_CHUNKS * CHUNK_BYTES / 1024**3,
        blocking_timeout_secs=1,
    ) as (server, engine):
        quotas = engine.storage.quota_manager.list_quotas()
        assert {e.cache_salt: e.limit_bytes for e in quotas} == {
            "a": 4 * CHUNK_BYTES,
            "b": CHUNK_BYTES,
        }
        alice, bob = (_worker(ring, server.endpoint, w) for w in ("alice", "bob"))
        try:
            for i in range(2):
                assert alice.store(_prompt(i), list(range(8)))
            for i in range(10, 10 + L1_CHUNKS):  # twice what L1 holds
                assert bob.store(_prompt(i), list(range(8)))
            assert engine.storage.local_cpu_backend.evictions > 0, "the test must evict"
            assert all(alice.lookup(_prompt(i)) == 2 * CHUNK for i in range(2))
            usage = engine.storage.get_usage_bytes_by_cache_salt()
            assert usage["a"] == 4 * CHUNK_BYTES
        finally:
            alice.close()
            bob.close()


def test_tenant_quotas_need_isolated_lru(ring: KeyRing, tmp_path: Path) -> None:
    config = MPServerConfig(
        curve_secret_key_file=str(ring.server_secret),
        authorized_keys=str(ring.authorized_dir),
        tenants_file=str(ring.root / "tenants.yaml"),
        eviction_policy="LRU",
        shm_name="",
        http_port=0,
        prometheus_port=0,
    )
    with pytest.raises(ValueError, match="only --eviction-policy IsolatedLRU enforces"):
        build_cache_server(config)
