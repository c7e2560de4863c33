"""``LMCacheMPConnector`` survives its server: kill -9, restart on the same port, start late.

A real ``lmcache server`` subprocess; the connector's two roles driven through their
vLLM-facing methods (vLLM's classes, no model).  Requires vLLM like
``test_connector_vllm.py`` (the ``vllm-e2e`` nox session runs it).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from prerequisites import require_module

require_module(
    "vllm",
    "vLLM is installed only in the vllm-e2e nox session (nox -s vllm-e2e)",
    required_env="LMCACHE_TEST_REQUIRE_VLLM",
)

from vllm.config import KVEventsConfig, KVTransferConfig  # noqa: E402
from vllm.distributed.kv_events import BlockRemoved, BlockStored  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402

from lmcache.integration.vllm.lmcache_mp_connector import (  # noqa: E402
    LMCacheMPConnector,
    LMCacheMPConnectorMetadata,
    LMCacheMPRequestMetadata,
    LoadStoreOp,
)
from lmcache.v1.multiprocess.worker.client import (  # noqa: E402
    MPClient,
    ServerUnavailableError,
    free_url,
)

BLOCK_SIZE, CHUNK_SIZE, NUM_BLOCKS, NUM_HEADS, HEAD_SIZE = 16, 32, 12, 2, 8
PROMPT = list(range(1000, 1080))  # 80 tokens: two full chunks are stored and hit
STORED = 64
HEARTBEAT_S = 0.3


class RestartableServer:
    """``lmcache server`` on one fixed port that can be killed and started again."""

    def __init__(self, port: int, log_dir: Path) -> None:
        self.port = port
        self.url = f"tcp://127.0.0.1:{port}"
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_MP_")}
        env.pop("LMCACHE_ADMIN_TOKEN", None)
        log = open(self.log_dir / f"server{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lmcache.cli.main",
                "server",
                "--port",
                str(self.port),
                "--chunk-size",
                str(CHUNK_SIZE),
                "--l1-size-gb",
                "0.0625",
                "--http-port",
                "0",
                "--prometheus-port",
                "0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                MPClient(self.url, timeout=2, connect_timeout=0.5).close()
                return
            except ServerUnavailableError:
                time.sleep(0.1)
        raise AssertionError(f"server did not come up:\n{self.log()}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def log(self) -> str:
        return (self.log_dir / f"server{self.starts}.log").read_text(errors="replace")

    def stats(self) -> object:
        with MPClient(self.url, timeout=5) as client:
            return client.get_stats()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RestartableServer]:
    port = int(free_url().rsplit(":", 1)[1])
    srv = RestartableServer(port, tmp_path)
    yield srv
    srv.stop()


def _vllm_config(
    port: int, server_urls: list[str] | None = None, kv_events: bool = False
) -> SimpleNamespace:
    where = (
        {"lmcache.mp.server_urls": ",".join(server_urls)}
        if server_urls
        else {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": str(port)}
    )
    return SimpleNamespace(
        kv_events_config=KVEventsConfig(enable_kv_cache_events=kv_events) if kv_events else None,
        kv_transfer_config=KVTransferConfig(
            kv_connector="LMCacheMPConnector",
            kv_connector_module_path="lmcache.integration.vllm.lmcache_mp_connector",
            kv_role="kv_both",
            kv_load_failure_policy="recompute",
            kv_connector_extra_config={
                **where,
                "lmcache.mp.mq_timeout": "5",
                "lmcache.mp.heartbeat_interval": str(HEARTBEAT_S),
                "lmcache.mp.mp_transfer_mode": "engine_driven",
            },
        ),
        model_config=SimpleNamespace(model="m", served_model_name="m"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1),
        cache_config=SimpleNamespace(block_size=BLOCK_SIZE),
    )


class Engine:
    """The scheduler and worker connectors of one fake engine, and its KV cache."""

    def __init__(
        self, port: int, server_urls: list[str] | None = None, kv_events: bool = False
    ) -> None:
        config = _vllm_config(port, server_urls, kv_events)
        spec = SimpleNamespace(num_kv_heads=NUM_HEADS, head_size=HEAD_SIZE)
        kv_config = SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec)])
        self.scheduler = LMCacheMPConnector(config, KVConnectorRole.SCHEDULER, None)
        self.worker = LMCacheMPConnector(config, KVConnectorRole.WORKER, kv_config)
        # vLLM CPU layout [NB, NH, BS, 2*HS]
        self.kv = {
            f"layer.{i}": torch.randn(NUM_BLOCKS, NUM_HEADS, BLOCK_SIZE, 2 * HEAD_SIZE)
            for i in range(2)
        }
        self.worker.register_kv_caches(self.kv)
        self._requests = 0

    def close(self) -> None:
        self.worker.shutdown()
        self.scheduler.shutdown()

    def lookup(self, prompt: list[int] = PROMPT) -> int:
        """Tokens the scheduler says vLLM may load for a new request of ``prompt``."""
        self._requests += 1
        request = SimpleNamespace(request_id=f"req-{self._requests}", prompt_token_ids=prompt)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            hit, is_async = self.scheduler.get_num_new_matched_tokens(request, 0)
            assert is_async is bool(hit)  # a hit is loaded asynchronously (the default)
            if hit is not None:
                self.scheduler.request_finished(request, [])
                return int(hit)
            time.sleep(0.01)
        raise AssertionError("the lookup never finished")

    def _step(self, meta: LMCacheMPConnectorMetadata) -> set[int]:
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        self.worker.wait_for_save()
        self.worker.clear_connector_metadata()
        return set(self.worker.get_block_ids_with_load_errors())

    def store(self, blocks: tuple[int, ...] = (0, 1, 2, 3), prompt: list[int] = PROMPT) -> None:
        op = LoadStoreOp(tuple(prompt[:STORED]), (blocks,), 0, STORED)
        meta = LMCacheMPConnectorMetadata(stores=[LMCacheMPRequestMetadata("s", op)])
        assert self._step(meta) == set()  # a store never reports blocks to recompute

    def store_held(self, request_id: str) -> set[str] | None:
        """A step that stores a finished request whose blocks vLLM kept for it (lazy
        offload under pressure); what ``get_finished`` then reports as sent."""
        op = LoadStoreOp(tuple(PROMPT[:STORED]), ((0, 1, 2, 3),), 0, STORED)
        item = LMCacheMPRequestMetadata(request_id, op)
        assert (
            self._step(LMCacheMPConnectorMetadata(stores=[item], held_requests=[request_id]))
            == set()
        )
        sent, _ = self.worker.get_finished(set())
        return sent

    def load(self, blocks: tuple[int, ...] = (4, 5, 6, 7), prompt: list[int] = PROMPT) -> set[int]:
        """Load the stored prefix into ``blocks``; the blocks vLLM must recompute."""
        op = LoadStoreOp(tuple(prompt[:STORED]), (blocks,), 0, STORED)
        return self._step(LMCacheMPConnectorMetadata(loads=[LMCacheMPRequestMetadata("l", op)]))

    def load_async(self, blocks: tuple[int, ...] = (4, 5, 6, 7)) -> set[int]:
        """``load`` as vLLM runs an async one: steps until ``get_finished`` reports it."""
        op = LoadStoreOp(tuple(PROMPT[:STORED]), (blocks,), 0, STORED)
        item = LMCacheMPRequestMetadata("la", op, async_load=True)
        errors = self._step(LMCacheMPConnectorMetadata(loads=[item]))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, received = self.worker.get_finished(set())
            # Failed blocks come no later than the step that reports the request.
            errors |= self._step(LMCacheMPConnectorMetadata())
            if received:
                assert received == {"la"}
                return errors
            time.sleep(0.01)
        raise AssertionError("the async load was never reported by get_finished")

    def blocks_equal(self, a: tuple[int, ...], b: tuple[int, ...]) -> bool:
        return all(torch.equal(t[list(a)], t[list(b)]) for t in self.kv.values())


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _worker_registered(server: RestartableServer) -> bool:
    return int(getattr(server.stats(), "engine_driven_workers", 0)) == 1


def _round_trip(engine: Engine, server: RestartableServer) -> None:
    """Miss, store, hit, load: the cache works against the server now running."""
    assert engine.lookup() == 0
    engine.store()
    assert engine.lookup() == STORED
    for t in engine.kv.values():
        t[[4, 5, 6, 7]] = 0
    assert engine.load() == set()
    assert engine.blocks_equal((0, 1, 2, 3), (4, 5, 6, 7))
    for t in engine.kv.values():
        t[[8, 9, 10, 11]] = 0
    assert engine.load_async((8, 9, 10, 11)) == set()
    assert engine.blocks_equal((0, 1, 2, 3), (8, 9, 10, 11))


def test_kill9_and_restart_on_the_same_port(
    server: RestartableServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.start()
    engine = Engine(server.port)
    try:
        _round_trip(engine, server)
        first = server.stats()

        server.kill9()
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="lmcache.integration.vllm"):
            _wait(lambda: engine.worker.health.is_down, "the worker to notice the outage")
            # In the gap: misses, skipped stores, failed loads reported for recompute.
            assert engine.lookup() == 0
            engine.store()
            assert engine.load() == {4, 5, 6, 7}
            assert engine.load() == {4, 5, 6, 7}
            assert engine.load_async() == {4, 5, 6, 7}

            server.start()
            _wait(lambda: _worker_registered(server), "the worker to register again")
            _wait(
                lambda: not engine.worker.health.is_down and not engine.scheduler.health.is_down,
                "both sides to switch the cache back on",
            )
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        # One warning per connector side and outage, whatever happened in the gap.
        assert 1 <= len(warnings) <= 2, [r.getMessage() for r in warnings]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert server.stats().server_incarnation != first.server_incarnation

        # The restarted server is empty: a miss, then hits again after the first store.
        _round_trip(engine, server)
    finally:
        engine.close()


def test_held_blocks_are_reported_sent_after_their_store_even_with_the_server_gone(
    server: RestartableServer,
) -> None:
    """vLLM frees a finished request's kept blocks only when get_finished reports it: after
    the store landed, and also when it could not (never kept forever)."""
    server.start()
    engine = Engine(server.port)
    try:
        assert engine.store_held("held-1") == {"held-1"}
        assert engine.lookup() == STORED  # stored before it was reported
        assert engine.worker.get_finished(set()) == (None, None)  # reported once
        server.kill9()
        _wait(lambda: engine.worker.health.is_down, "the worker to notice the outage")
        assert engine.store_held("held-2") == {"held-2"}
    finally:
        engine.close()


def test_server_that_starts_after_vllm_is_used_once_it_appears(
    server: RestartableServer,
) -> None:
    engine = Engine(server.port)  # nothing listens yet: the cache is off
    try:
        assert engine.worker.health.is_down and engine.scheduler.health.is_down
        assert engine.lookup() == 0
        engine.store()  # skipped, not an error
        assert engine.load() == {4, 5, 6, 7}

        server.start()
        _wait(lambda: _worker_registered(server), "the worker to register")
        _wait(lambda: engine.scheduler.chunk_size == CHUNK_SIZE, "the scheduler to connect")
        _wait(lambda: not engine.scheduler.health.is_down, "the scheduler to switch on")
        _round_trip(engine, server)
    finally:
        engine.close()


def _published_events(engine: Engine, wanted: type, timeout: float = 30.0) -> list[object]:
    """Steps the worker until vLLM's scheduler side publishes a ``wanted`` event."""
    published: list[object] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        container = engine.worker.get_kv_connector_kv_cache_events()
        engine.scheduler.update_connector_output(KVConnectorOutput(kv_cache_events=container))
        published.extend(engine.scheduler.take_events())
        if any(isinstance(e, wanted) for e in published):
            return published
        time.sleep(0.06)
    raise AssertionError(f"no {wanted.__name__} published; got {published}")


def test_kv_events_reach_vllm_and_are_withdrawn_after_a_restart(
    server: RestartableServer,
) -> None:
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    from lmcache.utils import chunk_hashes
    from lmcache.v1.multiprocess.server.kv_events import hash_bytes

    server.start()
    engine = Engine(server.port, kv_events=True)
    try:
        engine.store()
        events = _published_events(engine, BlockStored)
        stored = [e for e in events if isinstance(e, BlockStored)]
        # As vLLM publishes them (bytes, or ints with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES).
        hashes = [
            maybe_convert_block_hash(hash_bytes(h))
            for h in chunk_hashes(PROMPT[:STORED], CHUNK_SIZE)
        ]
        assert [e.block_hashes for e in stored] == [[h] for h in hashes]
        assert [e.parent_block_hash for e in stored] == [None, hashes[0]]
        assert [e.token_ids for e in stored] == [
            PROMPT[:CHUNK_SIZE],
            PROMPT[CHUNK_SIZE:STORED],
        ]
        assert {e.block_size for e in stored} == {CHUNK_SIZE}
        assert list(engine.scheduler.take_events()) == []  # taken once

        # The restarted server holds nothing: what was announced is withdrawn.
        server.kill9()
        server.start()
        _wait(lambda: _worker_registered(server), "the worker to register again")
        events = _published_events(engine, BlockRemoved)
        removed = [e for e in events if isinstance(e, BlockRemoved)]
        assert sorted(h for e in removed for h in e.block_hashes) == sorted(hashes)
    finally:
        engine.close()


# Needs vLLM: the vllm-e2e nox session runs exactly these files (-m vllm).
pytestmark = pytest.mark.vllm
