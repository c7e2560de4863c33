"""``LookupThread``: lookups sent and polled off the scheduler thread (no vLLM needed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from lmcache.integration.vllm.lookup_thread import LOOKUP_FAILED, LookupThread
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.worker.client import ServerUnavailableError


class ScriptedLink:
    """``answers[request_id]``: the status polls' answers in order (the last one repeats)."""

    def __init__(self, answers: dict[str, list[int | None]], fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.answers = answers
        self.fail = fail
        self.calls: list[tuple[str, str]] = []
        self.threads: set[str] = set()

    def run(self, what: str, call: Callable[[Any], Any]) -> Any:
        link = self

        class Client:
            def call(self, operation: str, *args: Any, timeout: float) -> Any:
                request_id = args[0].request_id if operation == "lookup" else args[0]
                link.calls.append((operation, request_id))
                link.threads.add(threading.current_thread().name)
                if request_id in link.fail:
                    raise ServerUnavailableError("down")
                if operation == "query_prefetch_status":
                    queue = link.answers[request_id]
                    return queue.pop(0) if len(queue) > 1 else queue[0]
                return None

        return call(Client())


def _key(request_id: str) -> IPCCacheServerKey:
    return IPCCacheServerKey.from_token_ids("m", 1, None, list(range(64)), request_id=request_id)


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_hit_arrives_once_the_prefetch_is_done_and_each_request_is_independent() -> None:
    link = ScriptedLink({"slow": [None], "fast": [None, None, 3]})
    lookups = LookupThread(link, 1, 5.0)  # type: ignore[arg-type]
    lookups.submit("slow", _key("slow"))
    lookups.submit("fast", _key("fast"))
    # A prefetch that never ends (slow) does not hold up the other request.
    _wait_for(lambda: lookups.result("fast") is not None)
    assert lookups.result("fast") == 3
    assert lookups.result("slow") is None
    assert link.threads == {"lmcache-lookup"}
    lookups.end_session("slow")
    lookups.end_session("fast")
    lookups.close()  # runs the queued end_sessions first
    assert link.calls[-2:] == [("end_session", "slow"), ("end_session", "fast")]
    assert ("lookup", "slow") in link.calls
    polls = [c for c in link.calls if c == ("query_prefetch_status", "slow")]
    assert len(polls) >= 1
    assert lookups.result("slow") is None  # forgotten


def test_failed_lookup_is_reported_as_failed_not_pending() -> None:
    link = ScriptedLink({}, fail={"x"})
    lookups = LookupThread(link, 1, 5.0)  # type: ignore[arg-type]
    lookups.submit("x", _key("x"))
    _wait_for(lambda: lookups.result("x") is not None)
    assert lookups.result("x") == LOOKUP_FAILED
    lookups.forget("x")
    lookups.close()
    assert ("end_session", "x") not in link.calls
