"""The cache server's background prefetch from a Redis tier that dies mid-prefetch."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import fill_obj, make_config
from redis_servers import RedisServer, make_redis_backend, skip_without_redis

from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.state import CacheServerSettings
from lmcache.v1.multiprocess.wire.chunking import prefix_chunks
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager

pytestmark = pytest.mark.redis

CHUNK_TOKENS = 16


def test_redis_killed_mid_prefetch_leaves_misses_never_wrong_bytes(tmp_path: Path) -> None:
    skip_without_redis()
    redis = RedisServer(tmp_path).start()
    cpu = LocalCPUBackend(make_config(max_local_cpu_size="1MiB"))
    tier = make_redis_backend(redis.url, cpu, optional=True, connect_timeout_s=0.5)
    backends: OrderedDict[str, StorageBackendInterface] = OrderedDict(
        [("LocalCPUBackend", cpu), ("RedisBackend", tier)]
    )
    storage = StorageManager(make_config(), backends=backends)
    settings = CacheServerSettings(
        chunk_size=CHUNK_TOKENS, prefetch_max_in_flight=1, prefetch_wait_timeout_seconds=10
    )
    server = MPCacheServer(settings, storage, enable_metrics=False)
    try:
        tokens = tuple(range(4 * CHUNK_TOKENS))
        key = IPCCacheServerKey("org/model", 1, None, tokens, 0, len(tokens), request_id="r")
        keys = [server._storage_key(key, 0, s.chunk_hash) for s in prefix_chunks(key, 16)]
        expected = []
        for i, k in enumerate(keys):
            obj = fill_obj(cpu, 10 + i)
            expected.append(obj.tensor.clone())  # type: ignore[union-attr]
            storage.batched_submit_put_task([k], [obj])
            obj.ref_count_down()
        storage.wait_for_puts()
        for k in keys:  # only Redis holds them now
            assert cpu.remove(k)

        read = tier.get_blocking

        def read_then_die(k: Any) -> Any:
            obj = read(k)
            redis.kill()  # the first read succeeds, every later one finds Redis gone
            return obj

        tier.get_blocking = read_then_die  # type: ignore[method-assign]
        server.lookup(key, 1)
        assert server.wait_prefetch_status("r", 20.0) == 1
        progress = server.query_prefetch_progress("r")
        assert progress is not None and (progress.done_chunks, progress.failed_chunks) == (4, 3)
        assert server._get_all(keys) is None  # misses, not wrong bytes
        objs = server._get_all(keys[:1])
        assert objs is not None
        assert torch.equal(objs[0].tensor, expected[0])  # type: ignore[arg-type]
        objs[0].ref_count_down()
        server.end_session("r")
        assert server.pinned_objects() == 0
    finally:
        server.close()
        redis.stop()
