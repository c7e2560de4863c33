"""``SchedulerSide``: a lookup lost with a restarted server becomes a miss, never a hang;
a request vLLM could not schedule yet is looked up again and takes the larger hit.

The link is a stand-in whose server accepted the lookup but never answers its status (as
a restarted server, which lost the session, does).  Requires vLLM (the metadata class
subclasses vLLM's); the ``vllm-e2e`` nox session runs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from prerequisites import require_module

require_module(
    "vllm",
    "vLLM is installed only in the vllm-e2e nox session (nox -s vllm-e2e)",
    required_env="LMCACHE_TEST_REQUIRE_VLLM",
)

from lmcache.integration.vllm import scheduler_side  # noqa: E402
from lmcache.integration.vllm.mp_config import parse_extra_config  # noqa: E402
from lmcache.integration.vllm.scheduler_side import SchedulerSide  # noqa: E402
from lmcache.integration.vllm.scheduler_state import LMCacheMPRequestState  # noqa: E402

CHUNK = 32


class SilentLink:
    """Takes lookups; their status never arrives (``None``)."""

    def __init__(self) -> None:
        self.generation = 1
        self.ready = True
        self.chunk_size = CHUNK
        self.block_size = CHUNK  # vLLM's block size (ServerLink.block_size)
        self.calls: list[str] = []
        self.threads: set[str] = set()

    def run(self, what: str, call: Any) -> Any:
        self.calls.append(what)
        self.threads.add(threading.current_thread().name)
        return None


def _wait(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _side(link: SilentLink) -> SchedulerSide:
    return SchedulerSide(link, parse_extra_config({}), "m", 1)  # type: ignore[arg-type]


def _request(rid: str) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, prompt_token_ids=list(range(100)))


def test_pending_lookup_stays_pending_while_the_server_is_the_same() -> None:
    link = SilentLink()
    side = _side(link)
    request = _request("a")
    assert side.get_num_new_matched_tokens(request, 0) == (None, False)
    _wait(lambda: link.calls.count("query_prefetch_status") >= 3)
    assert side.get_num_new_matched_tokens(request, 0) == (None, False)
    assert link.calls.count("lookup") == 1  # sent once, then only polled
    # Every call went over the lookup thread, never the scheduler's.
    assert link.threads == {"lmcache-lookup"}
    side.finish("a")
    side.close()
    assert link.calls[-1] == "end_session"


def test_blocking_lookup_status_waits_on_the_scheduler_thread() -> None:
    link = SilentLink()
    side = SchedulerSide(
        link,  # type: ignore[arg-type]
        parse_extra_config({"lmcache.mp.nonblocking_lookup_status": "false"}),
        "m",
        1,
    )
    # The server's wait_prefetch_status gave up (None): a miss, never a pending answer.
    assert side.get_num_new_matched_tokens(_request("w"), 0) == (0, False)
    assert link.calls == ["lookup", "wait_prefetch_status"]
    assert link.threads == {threading.current_thread().name}


def test_lookup_sent_to_an_earlier_server_incarnation_is_a_miss() -> None:
    link = SilentLink()
    side = _side(link)
    request = _request("b")
    assert side.get_num_new_matched_tokens(request, 0) == (None, False)
    link.generation += 1  # the heartbeat met a new server incarnation
    assert side.get_num_new_matched_tokens(request, 0) == (0, False)
    # A miss, not an opt-out: the request's prefix is still stored on the new server.
    assert side._trackers["b"].state is LMCacheMPRequestState.READY
    side.finish("b")
    side.close()  # runs what was queued
    assert "end_session" not in link.calls  # the session died with the old server


def test_lookup_unanswered_past_the_bound_is_a_miss(monkeypatch: Any) -> None:
    link = SilentLink()
    side = _side(link)
    request = _request("c")
    clock = [1000.0]
    monkeypatch.setattr(scheduler_side.time, "monotonic", lambda: clock[0])
    assert side.get_num_new_matched_tokens(request, 0) == (None, False)
    clock[0] += scheduler_side.LOOKUP_TIMEOUT_S + 0.1
    assert side.get_num_new_matched_tokens(request, 0) == (0, False)


# Needs vLLM: the vllm-e2e nox session runs exactly these files (-m vllm).
pytestmark = pytest.mark.vllm


class AnsweringLink(SilentLink):
    """Answers each lookup's status with ``hits[n]`` chunks for the n-th lookup sent."""

    def __init__(self, hits: list[int]) -> None:
        super().__init__()
        self.hits = hits
        self.lookups = 0

    def run(self, what: str, call: Any) -> Any:
        super().run(what, call)
        if what == "lookup":
            self.lookups += 1
            return None
        if what == "query_prefetch_status":
            return self.hits[min(self.lookups, len(self.hits)) - 1]
        return None


def _refresh_side(link: SilentLink, interval: str = "0.2") -> SchedulerSide:
    extra = {"lmcache.mp.lookup_refresh_interval": interval}
    return SchedulerSide(link, parse_extra_config(extra), "m", 1)  # type: ignore[arg-type]


def _answer(side: SchedulerSide, request: Any) -> tuple[int | None, bool]:
    """The first answer that is not 'pending'."""
    deadline = time.monotonic() + 10
    while (answer := side.get_num_new_matched_tokens(request, 0))[0] is None:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
    return answer


def test_a_waiting_request_is_looked_up_again_and_takes_the_larger_hit(monkeypatch: Any) -> None:
    # First lookup: 1 chunk; another request stores the rest; the repeat finds 3 chunks.
    link = AnsweringLink([1, 3])
    side = _refresh_side(link)
    clock = [1000.0]
    monkeypatch.setattr(scheduler_side.time, "monotonic", lambda: clock[0])
    request = _request("r")
    assert _answer(side, request) == (CHUNK, True)
    # vLLM could not schedule it and asks again within the interval: no repeat yet.
    assert side.get_num_new_matched_tokens(request, 0) == (CHUNK, True)
    assert link.calls.count("lookup") == 1
    clock[0] += 0.25
    # The repeat goes out; until it answers, the last hit stands (never 'pending').
    assert side.get_num_new_matched_tokens(request, 0) == (CHUNK, True)
    _wait(lambda: side._lookup_thread.result("r") is not None)
    assert side.get_num_new_matched_tokens(request, 0) == (3 * CHUNK, True)
    assert link.calls.count("lookup") == 2
    stats = side.stats.take()
    assert stats is not None
    assert stats["lookups"] == 1
    assert stats["lookup_refreshes"] == 1
    assert stats["refresh_hit_tokens"] == 2 * CHUNK
    assert stats["hit_tokens"] == 3 * CHUNK
    side.finish("r")
    side.close()


def test_no_repeat_lookup_for_a_full_hit_or_when_turned_off(monkeypatch: Any) -> None:
    clock = [1000.0]
    monkeypatch.setattr(scheduler_side.time, "monotonic", lambda: clock[0])
    full = AnsweringLink([4])  # 4 chunks of 32 >= the 100-token prompt
    side = _refresh_side(full)
    request = _request("f")
    _answer(side, request)
    clock[0] += 5
    side.get_num_new_matched_tokens(request, 0)
    assert full.calls.count("lookup") == 1
    side.close()

    off = AnsweringLink([1, 3])
    side = _refresh_side(off, interval="0")
    request = _request("o")
    _answer(side, request)
    clock[0] += 5
    assert side.get_num_new_matched_tokens(request, 0) == (CHUNK, True)
    assert off.calls.count("lookup") == 1
    side.close()


def test_a_failed_repeat_lookup_keeps_the_last_hit(monkeypatch: Any) -> None:
    link = AnsweringLink([2])
    side = _refresh_side(link)
    clock = [1000.0]
    monkeypatch.setattr(scheduler_side.time, "monotonic", lambda: clock[0])
    request = _request("x")
    assert _answer(side, request) == (2 * CHUNK, True)
    clock[0] += 0.25
    link.hits = [2, scheduler_side.LOOKUP_FAILED]
    side.get_num_new_matched_tokens(request, 0)
    _wait(lambda: side._lookup_thread.result("x") is not None)
    assert side.get_num_new_matched_tokens(request, 0) == (2 * CHUNK, True)
    assert not side._trackers["x"].refresh_pending
    side.close()
