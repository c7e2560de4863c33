"""Chunks stored by the server carry the request's ``cache_salt`` down to the tiers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mp_server_helpers import in_process_server, make_kv, unlink_kv

from lmcache.v1.multiprocess.server import MPServer
from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker
from lmcache.v1.storage_backend.cache_salt import salt_of

CHUNK = 16
GEO = {"num_layers": 2, "num_heads": 2, "head_size": 16, "num_blocks": 16, "block_size": 4}


@pytest.fixture
def served() -> Iterator[tuple[MPServer, MPCacheServer]]:
    with in_process_server(chunk_size=CHUNK) as pair:
        yield pair


def test_each_stored_chunk_knows_its_salt(served: tuple[MPServer, MPCacheServer]) -> None:
    server, engine = served
    kv = make_kv(seed=1, **GEO)
    worker = KVCacheWorker(
        kv, model_name="salty", server_url=server.endpoint, mode="engine_driven", sub_path="inline"
    )
    try:
        prompt = list(range(2 * CHUNK))
        assert worker.store(prompt, list(range(8)), cache_salt="tenant-a")
        assert worker.store(prompt, list(range(8)))
        salts = sorted(salt_of(k) for k in engine.storage.local_cpu_backend.get_keys())
        assert salts == ["", "", "tenant-a", "tenant-a"]
    finally:
        worker.close()
        unlink_kv(kv)
