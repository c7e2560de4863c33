"""Worker-side async loads: run in the background, reported once through ``get_finished``.

A ``WorkerSide`` with a stand-in link and transfer context (no vLLM, no server): an async
load does not block ``load``; it is reported as finished exactly once after it ended; a
failed one (False, an exception, a server that is down) is reported as finished too, with
its blocks among the load errors of the same step.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from lmcache.integration.vllm.async_loads import AsyncLoader
from lmcache.integration.vllm.mp_config import parse_extra_config
from lmcache.integration.vllm.scheduler_state import LMCacheMPRequestMetadata, LoadStoreOp
from lmcache.integration.vllm.worker_side import WorkerSide

BLOCK = 16
CHUNK = 32


class FakeHealth:
    def __init__(self) -> None:
        self.down: list[str] = []
        self.warnings: list[str] = []

    def mark_down(self, reason: str, *, warn: bool = True) -> None:
        self.down.append(reason)

    def warn_once(self, message: str, *args: Any) -> None:
        self.warnings.append(message % args)


class FakeLink:
    def __init__(self) -> None:
        self.ready = True
        self.chunk_size = CHUNK
        self.health = FakeHealth()


class GatedTransfer:
    """Retrieves wait for ``gate``; ``outcome[request_id]`` is True, False or an exception."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.outcome: dict[str, Any] = {}
        self.retrieved: list[tuple[str, list[list[int]], int]] = []
        self.threads: set[str] = set()

    def submit_retrieve(
        self,
        request_id: str,
        key: Any,
        views: Any,
        block_ids: list[list[int]],
        event: Any,
        blocks_in_chunk: int,
        skip: int,
    ) -> Future[bool]:
        self.threads.add(threading.current_thread().name)
        assert self.gate.wait(10), "test gate never opened"
        self.retrieved.append((request_id, block_ids, skip))
        future: Future[bool] = Future()
        result = self.outcome.get(request_id, True)
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
        return future


def _worker() -> tuple[WorkerSide, FakeLink, GatedTransfer]:
    link = FakeLink()
    worker = WorkerSide(link, parse_extra_config({}, env={}), "m", 1, BLOCK)  # type: ignore[arg-type]
    transfer = GatedTransfer()
    worker._transfer = transfer
    return worker, link, transfer


def _item(
    rid: str, end: int = 64, skip: int = 0, *, async_load: bool = True
) -> LMCacheMPRequestMetadata:
    op = LoadStoreOp(
        token_ids=tuple(range(end)),
        block_ids=((10, 11, 12, 13, 14),),
        start=0,
        end=end,
        skip_first_n_tokens=skip,
    )
    return LMCacheMPRequestMetadata(rid, op, async_load=async_load)


def _finished_within(worker: WorkerSide, seconds: float = 10.0) -> set[str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        finished = worker.finished_loads()
        if finished:
            return finished
        time.sleep(0.01)
    raise AssertionError("the async load never finished")


def test_async_load_runs_in_the_background_and_is_reported_once() -> None:
    worker, _, transfer = _worker()
    worker.load([_item("a")])  # returns although the transfer is still gated
    assert worker.finished_loads() == set()
    assert transfer.retrieved == []
    transfer.gate.set()
    assert _finished_within(worker) == {"a"}
    assert transfer.retrieved == [("a", [[10, 11, 12, 13, 14]], 0)]
    assert transfer.threads and all(t.startswith("lmcache-async-load") for t in transfer.threads)
    assert worker.take_load_errors() == set()
    assert worker.finished_loads() == set()  # reported once
    worker.close()


@pytest.mark.parametrize("outcome", [False, RuntimeError("server forgot the worker")])
def test_failed_async_load_is_finished_and_its_blocks_are_load_errors(outcome: Any) -> None:
    worker, link, transfer = _worker()
    transfer.outcome["b"] = outcome
    transfer.gate.set()
    # Tokens [16, 64) were to be loaded (the first block is vLLM's own prefix cache hit).
    worker.load([_item("b", end=64, skip=16)])
    assert _finished_within(worker) == {"b"}
    assert worker.take_load_errors() == {11, 12, 13}
    assert worker.take_load_errors() == set()
    assert link.health.warnings  # the failure is logged
    worker.close()


def test_async_load_while_the_server_is_down_fails_fast_into_recomputation() -> None:
    worker, link, transfer = _worker()
    link.ready = False
    worker.load([_item("c", end=32)])
    assert _finished_within(worker) == {"c"}
    assert worker.take_load_errors() == {10, 11}
    assert transfer.retrieved == []
    worker.close()


def test_sync_load_finishes_inside_load_and_is_not_reported_by_get_finished() -> None:
    worker, _, transfer = _worker()
    transfer.gate.set()
    worker.load([_item("d", async_load=False)])
    assert [r[0] for r in transfer.retrieved] == ["d"]
    assert worker.finished_loads() == set()
    worker.close()


def test_loader_keeps_order_and_reports_each_request() -> None:
    done: list[str] = []
    loader = AsyncLoader(lambda item: done.append(item.request_id) or item.request_id != "y")
    for rid in ("x", "y", "z"):
        loader.submit(_item(rid))
    deadline = time.monotonic() + 10
    finished: set[str] = set()
    failed: list[str] = []
    while len(finished) < 3 and time.monotonic() < deadline:
        more, bad = loader.poll()
        finished |= more
        failed += [item.request_id for item in bad]
        time.sleep(0.01)
    assert done == ["x", "y", "z"]
    assert finished == {"x", "y", "z"}
    assert failed == ["y"]
    assert loader.num_pending == 0
    loader.close()
