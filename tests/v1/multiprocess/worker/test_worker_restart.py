"""A ``KVCacheWorker`` outlives its server: kill -9, restart on the same port, carry on.

The restarted server forgot the worker; the worker's heartbeat sees ``ping`` answer False
and registers again, in both transfer modes, without a new worker.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from mp_server_helpers import (
    BASE_ARGS,
    STORED_BLOCKS,
    STORED_TOKENS,
    ServerProcess,
    make_kv,
    unlink_kv,
)

from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

OTHER_BLOCKS = [b + len(STORED_BLOCKS) for b in STORED_BLOCKS]


def _start(tmp_path: Path, name: str, port: int | None = None) -> ServerProcess:
    server = ServerProcess([*BASE_ARGS, "--supported-transfer-mode", "auto"], tmp_path / name, port)
    server.wait_ready()
    return server


def _wait_registered(server: ServerProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with server.client() as client:
            stats = client.get_stats()
        if stats.engine_driven_workers + stats.lmcache_driven_workers == 1:
            return
        time.sleep(0.05)
    raise AssertionError(f"the worker did not register again:\n{server.log()}")


@pytest.mark.parametrize("mode", ["engine_driven", "lmcache_driven"])
def test_worker_registers_again_after_kill9_and_restart(tmp_path: Path, mode: str) -> None:
    shm = mode == "lmcache_driven"  # the server maps a CPU worker's KV from shared memory
    kv = make_kv(shm=shm, seed=3)
    server = _start(tmp_path, "first.log")
    worker = KVCacheWorker(
        kv, model_name="restart", server_url=server.url, mode=mode, heartbeat_interval=0.2,
        timeout=5.0,
    )  # fmt: skip
    restarted: ServerProcess | None = None
    try:
        assert worker.store(STORED_TOKENS, STORED_BLOCKS)
        with server.client() as client:
            first = client.get_stats().server_incarnation
        assert first

        server.stop(signal.SIGKILL)
        time.sleep(0.5)  # a few heartbeats fail meanwhile
        restarted = _start(tmp_path, "second.log", port=server.port)
        _wait_registered(restarted)
        with restarted.client() as client:
            assert client.get_stats().server_incarnation not in ("", first)

        # The new server is empty; the same worker stores and retrieves again.
        assert worker.lookup(STORED_TOKENS) == 0
        assert worker.store(STORED_TOKENS, STORED_BLOCKS)
        assert worker.lookup(STORED_TOKENS) == len(STORED_TOKENS)
        for layer in kv:
            layer[:, OTHER_BLOCKS] = 0
        assert worker.retrieve(STORED_TOKENS, OTHER_BLOCKS)
        for layer in kv:
            assert layer[:, OTHER_BLOCKS].equal(layer[:, STORED_BLOCKS])
    finally:
        worker.close()
        if restarted is not None:
            restarted.stop()
        server.stop()
        if shm:
            unlink_kv(kv)
