"""``LMCacheMPConnector`` with two real ``lmcache server`` processes (``lmcache.mp.server_urls``).

Each prefix lives on the server its placement picks; one server killed with ``kill -9``
turns only its prefixes into misses (and failed loads into recomputes), the other keeps
serving, and the killed one is used again once it restarts.  Requires vLLM like
``test_server_restart.py`` (whose server and fake-engine helpers it reuses).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_server_restart import (
    BLOCK_SIZE,
    STORED,
    Engine,
    RestartableServer,
    _wait,
)

from lmcache.integration.vllm.multi_server import server_index
from lmcache.v1.multiprocess.worker.client import free_url


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[RestartableServer]]:
    pair = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        port = int(free_url().rsplit(":", 1)[1])
        pair.append(RestartableServer(port, tmp_path / name))
    yield pair
    for srv in pair:
        srv.stop()


def _prompt_on(index: int, urls: list[str]) -> list[int]:
    """An 80-token prompt that the placement sends to server ``index``."""
    for seed in range(1000):
        prompt = [2000 + seed * 100 + i for i in range(80)]
        if server_index(prompt, "", BLOCK_SIZE, urls) == index:
            return prompt
    raise AssertionError(f"no prompt maps to server {index}")


def _stored(srv: RestartableServer) -> int:
    return int(getattr(srv.stats(), "stored_tokens", 0))


def _workers(srv: RestartableServer) -> int:
    return int(getattr(srv.stats(), "engine_driven_workers", 0))


def _round_trip(engine: Engine, prompt: list[int]) -> None:
    """Miss, store, hit, load back into other blocks: equal KV."""
    assert engine.lookup(prompt) == 0
    engine.store(prompt=prompt)
    assert engine.lookup(prompt) == STORED
    for t in engine.kv.values():
        t[[4, 5, 6, 7]] = 0
    assert engine.load(prompt=prompt) == set()
    assert engine.blocks_equal((0, 1, 2, 3), (4, 5, 6, 7))


def test_two_servers_one_late_then_killed_and_restarted(
    servers: list[RestartableServer], caplog: pytest.LogCaptureFixture
) -> None:
    """One test, three server starts: late start, kill -9 and restart, all per server."""
    a, b = servers
    a.start()  # b is not running yet
    urls = [a.url, b.url]
    on_a, on_b = _prompt_on(0, urls), _prompt_on(1, urls)
    engine = Engine(a.port, server_urls=urls)
    try:
        assert [link.url for link in engine.worker.links] == urls
        assert engine.scheduler.chunk_size is not None  # known from a alone
        # b down at start: only its prefixes miss.
        _round_trip(engine, on_a)
        assert engine.lookup(on_b) == 0
        assert engine.load(prompt=on_b) == {4, 5, 6, 7}

        b.start()
        _wait(lambda: _workers(b) == 1, "the worker to register with the late server")
        _wait(lambda: not engine.scheduler.links[1].health.is_down, "the scheduler to switch on")
        _round_trip(engine, on_b)
        assert (_stored(a), _stored(b)) == (STORED, STORED)  # each prefix on its owner only

        b.kill9()
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="lmcache.integration.vllm"):
            _wait(lambda: engine.worker.links[1].health.is_down, "the worker to notice")
            # a's prefixes: still hits, loaded without errors.
            assert engine.lookup(on_a) == STORED
            assert engine.load(prompt=on_a) == set()
            assert engine.blocks_equal((0, 1, 2, 3), (4, 5, 6, 7))
            # b's prefixes: misses, skipped stores, failed loads reported for recompute.
            assert engine.lookup(on_b) == 0
            engine.store(prompt=on_b)
            assert engine.load(prompt=on_b) == {4, 5, 6, 7}
            assert not engine.worker.links[0].health.is_down
            assert not engine.scheduler.links[0].health.is_down

            b.start()
            _wait(lambda: _workers(b) == 1, "the worker to register with the restarted server")
            _wait(
                lambda: (
                    not any(link.health.is_down for link in engine.scheduler.links)
                    and not any(link.health.is_down for link in engine.worker.links)
                ),
                "both sides to use the restarted server again",
            )
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        # One warning per connector side for the outage, each naming the dead server.
        assert 1 <= len(warnings) <= 2, warnings
        assert all(b.url in message for message in warnings), warnings
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert _workers(a) == 1  # a never saw an outage, so it kept its one registration

        _round_trip(engine, on_b)  # the restarted b is empty: miss, then hit again
        assert engine.lookup(on_a) == STORED
    finally:
        engine.close()


# Needs vLLM: the vllm-e2e nox session runs exactly these files (-m vllm).
pytestmark = pytest.mark.vllm
