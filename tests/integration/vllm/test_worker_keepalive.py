"""The heartbeat keeps a registered worker alive on the server, and registers it again
when the server forgot it (reaped), without any store or load in between.

A long prefill sends the server nothing for minutes; before the keep-alive the server
reaped the worker after ``--worker-reap-timeout-seconds`` and the next store failed with
``unknown_worker`` (seen with an 8k-token prompt on 2 CPU cores).  No vLLM needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import torch

from lmcache.integration.vllm.mp_client import HeartbeatThread, ServerLink
from lmcache.integration.vllm.mp_config import parse_extra_config
from lmcache.integration.vllm.worker_side import WorkerSide
from lmcache.v1.multiprocess.worker.client import MPClient

BLOCK_SIZE, CHUNK_SIZE, NUM_BLOCKS, NUM_HEADS, HEAD_SIZE = 16, 32, 8, 2, 8
REAP_S = 1.0


@pytest.fixture
def server_url(small_server: Callable[..., str]) -> str:
    return small_server(
        "--chunk-size", str(CHUNK_SIZE), "--worker-reap-timeout-seconds", str(REAP_S)
    )


@pytest.fixture
def registered(server_url: str) -> Iterator[tuple[ServerLink, WorkerSide]]:
    config = parse_extra_config({"lmcache.mp.mp_transfer_mode": "engine_driven"}, env={})
    link = ServerLink(server_url, 30.0, "", BLOCK_SIZE)
    assert link.open()
    worker = WorkerSide(link, config, "keepalive-model", 1, BLOCK_SIZE)
    kv = {
        f"layer.{i}": torch.zeros(NUM_BLOCKS, NUM_HEADS, BLOCK_SIZE, 2 * HEAD_SIZE)
        for i in range(2)
    }
    worker.register_kv_caches(kv, NUM_HEADS, HEAD_SIZE)
    try:
        yield link, worker
    finally:
        worker.close()
        link.close()


def _known(url: str, instance_id: int) -> bool:
    with MPClient(url, timeout=5) as client:
        return bool(client.ping(instance_id))


def test_heartbeat_keeps_a_silent_worker_registered(
    server_url: str, registered: tuple[ServerLink, WorkerSide]
) -> None:
    link, worker = registered
    heartbeat = HeartbeatThread(link, 0.2)
    heartbeat.start()
    try:
        time.sleep(4 * REAP_S + 1.0)  # the server reaps every second
        assert _known(server_url, worker.instance_id)
    finally:
        heartbeat.stop()
        heartbeat.join(5)


def test_a_forgotten_worker_registers_again_on_the_next_heartbeat(
    server_url: str, registered: tuple[ServerLink, WorkerSide]
) -> None:
    link, worker = registered
    time.sleep(4 * REAP_S + 1.0)  # no heartbeat (and no ping, which would refresh it)
    assert not _known(server_url, worker.instance_id), "the server never reaped it"
    generation = link.generation
    with MPClient(server_url, timeout=5) as probe:
        link.check(probe)
    assert link.generation == generation + 1
    assert _known(server_url, worker.instance_id)
