"""Two ``lmcache server`` processes sharing one Redis through ``--l2-adapter``."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from redis_servers import RedisServer

pytestmark = pytest.mark.redis

# The server suite's process helpers (subprocess on a free port, KV tensors).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "multiprocess"))


def test_chunk_stored_through_server_a_is_bit_exact_through_server_b(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    from mp_server_helpers import BASE_ARGS, CHUNK_SIZE, ServerProcess, make_kv

    from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

    adapter = json.dumps({"type": "resp", "url": redis_server.url, "namespace": "two-servers"})
    servers = [
        ServerProcess(
            [*BASE_ARGS, "--supported-transfer-mode", "auto", "--l2-adapter", adapter],
            tmp_path / f"server{i}.log",
        )
        for i in range(2)
    ]
    workers: list[KVCacheWorker] = []
    try:
        for server in servers:
            server.wait_ready()
        model = f"shared-{uuid.uuid4().hex[:8]}"
        src, dst = make_kv(seed=3), make_kv(seed=None)
        writer, reader = (
            KVCacheWorker(
                kv, model_name=model, server_url=s.url, mode="engine_driven", sub_path="inline"
            )
            for kv, s in ((src, servers[0]), (dst, servers[1]))
        )
        workers += [writer, reader]
        tokens = list(range(100, 100 + 3 * CHUNK_SIZE))
        src_ids, dst_ids = [1, 5, 9, 2, 7, 11, 3, 4, 6, 8, 10, 12], list(range(20, 32))
        assert reader.lookup(tokens) == 0
        assert writer.store(tokens, src_ids)
        deadline = time.monotonic() + 10
        while reader.lookup(tokens) < len(tokens) and time.monotonic() < deadline:
            time.sleep(0.05)  # server A writes through to Redis in the background
        assert reader.lookup(tokens) == len(tokens)
        assert reader.retrieve(tokens, dst_ids)
        assert all(torch.equal(s[:, src_ids], d[:, dst_ids]) for s, d in zip(src, dst))
    finally:
        for worker in workers:
            worker.close()
        for server in servers:
            server.stop()
