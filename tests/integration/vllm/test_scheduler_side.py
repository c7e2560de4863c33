"""``SchedulerSide``: a lookup lost with a restarted server becomes a miss, never a hang.

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
