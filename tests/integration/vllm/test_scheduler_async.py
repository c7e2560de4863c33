"""``SchedulerSide`` under vLLM's async-load contract, driven step by step with fakes.

vLLM (0.32) parks a request answered with ``load_kv_async=True`` in
``WAITING_FOR_REMOTE_KVS``: it is not among the step's scheduled requests, so its load
must be planned from ``update_state_after_alloc``'s blocks; once the load is reported, the
request is scheduled as new and must neither load again nor store what it loaded.
Requires vLLM (the metadata class subclasses vLLM's); the ``vllm-e2e`` nox session runs it.
"""

from __future__ import annotations

import enum
import time
from types import SimpleNamespace
from typing import Any

import pytest
from prerequisites import require_module

require_module(
    "vllm",
    "vLLM is installed only in the vllm-e2e nox session (nox -s vllm-e2e)",
    required_env="LMCACHE_TEST_REQUIRE_VLLM",
)

from lmcache.integration.vllm.mp_config import parse_extra_config  # noqa: E402
from lmcache.integration.vllm.scheduler_side import SchedulerSide  # noqa: E402
from lmcache.integration.vllm.scheduler_state import LMCacheMPRequestState  # noqa: E402

CHUNK = 32
PROMPT = 100


class Status(enum.Enum):
    WAITING = 1
    PREEMPTED = 2


class HitLink:
    """A server whose lookup hits ``hit_chunks`` chunks; ``pending`` polls answer None."""

    def __init__(self, hit_chunks: int, pending: int = 0) -> None:
        self.generation = 1
        self.ready = True
        self.chunk_size = CHUNK
        self.block_size = CHUNK  # vLLM's block size (ServerLink.block_size)
        self.hit_chunks = hit_chunks
        self.pending = pending
        self.calls: list[str] = []

    def run(self, what: str, call: Any) -> Any:
        self.calls.append(what)
        if what == "query_prefetch_status":
            if self.pending:
                self.pending -= 1
                return None
            return self.hit_chunks
        return None


def _matched(side: SchedulerSide, request: Any, computed: int) -> tuple[int | None, bool]:
    """vLLM's polling: ask every step until the lookup thread has the answer."""
    deadline = time.monotonic() + 10
    while True:
        answer = side.get_num_new_matched_tokens(request, computed)
        if answer[0] is not None:
            return answer
        assert time.monotonic() < deadline, "the lookup never finished"
        time.sleep(0.005)


def _side(link: HitLink, **extra: Any) -> SchedulerSide:
    return SchedulerSide(link, parse_extra_config(extra, env={}), "m", 1)  # type: ignore[arg-type]


def _request(rid: str) -> SimpleNamespace:
    tokens = list(range(PROMPT))
    return SimpleNamespace(
        request_id=rid, prompt_token_ids=tokens, all_token_ids=tokens, status=Status.WAITING
    )


def _output(new: list[tuple[str, list[int], int, int]] | None = None, resumed: Any = None) -> Any:
    """A SchedulerOutput stand-in: ``new`` is (req_id, blocks, computed, scheduled)."""
    new = new or []
    cached = SimpleNamespace(
        req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[]
    )
    if resumed is not None:
        rid, blocks, computed, _scheduled = resumed
        cached = SimpleNamespace(
            req_ids=[rid],
            new_block_ids=[[blocks]],
            resumed_req_ids={rid},
            num_computed_tokens=[computed],
        )
    return SimpleNamespace(
        scheduled_new_reqs=[
            SimpleNamespace(req_id=rid, block_ids=[blocks], num_computed_tokens=computed)
            for rid, blocks, computed, _ in new
        ],
        scheduled_cached_reqs=cached,
        num_scheduled_tokens={
            **{rid: scheduled for rid, _, _, scheduled in new},
            **({resumed[0]: resumed[3]} if resumed is not None else {}),
        },
    )


BLOCKS = [7, 8, 9, 10]  # block size 32 == chunk size: 4 blocks hold the 100-token prompt


def test_hit_is_loaded_asynchronously_from_the_blocks_of_the_allocation() -> None:
    link = HitLink(hit_chunks=3, pending=2)
    side = _side(link)
    request = _request("a")
    # Pending lookups: vLLM skips the request and asks again next step.
    assert _matched(side, request, 0) == (96, True)
    side.update_state_after_alloc(request, 96, [BLOCKS])
    # The parked request is not scheduled this step; its load is planned anyway.
    meta = side.build_connector_meta(_output())
    assert [item.request_id for item in meta.loads] == ["a"]
    load = meta.loads[0]
    assert load.async_load
    assert (load.op.start, load.op.end, load.op.skip_first_n_tokens) == (0, 96, 0)
    assert load.op.block_ids == (tuple(BLOCKS),)
    assert meta.stores == []
    assert side.build_connector_meta(_output()).loads == []  # planned once

    # Load reported finished: vLLM schedules it as new with 96 computed tokens and
    # calls update_state_after_alloc again without external tokens.
    side.update_state_after_alloc(request, 0, None)
    meta = side.build_connector_meta(_output([("a", BLOCKS, 96, 4)]))
    assert meta.loads == []
    # Only the tail is stored: the loaded prefix is on the server already.
    assert [(s.op.start, s.op.end) for s in meta.stores] == [(96, 100)]
    assert link.calls.count("lookup") == 1


def test_local_prefix_hit_is_skipped_by_the_async_load() -> None:
    side = _side(HitLink(hit_chunks=3))
    request = _request("b")
    assert _matched(side, request, 32) == (64, True)
    side.update_state_after_alloc(request, 64, [BLOCKS])
    (load,) = side.build_connector_meta(_output()).loads
    assert (load.op.end, load.op.skip_first_n_tokens) == (96, 32)


def test_miss_and_local_hit_are_not_async() -> None:
    side = _side(HitLink(hit_chunks=0))
    assert _matched(side, _request("c"), 0) == (0, False)
    side = _side(HitLink(hit_chunks=2))
    assert _matched(side, _request("d"), 64) == (0, False)


def test_async_load_off_plans_a_synchronous_load_with_the_step() -> None:
    side = _side(HitLink(hit_chunks=3), **{"lmcache.mp.async_load": "false"})
    request = _request("e")
    assert _matched(side, request, 0) == (96, False)
    side.update_state_after_alloc(request, 96, None)
    meta = side.build_connector_meta(_output([("e", BLOCKS, 0, 4)]))
    (load,) = meta.loads
    assert not load.async_load
    assert load.op.block_ids == (tuple(BLOCKS),)


def test_preempted_request_loads_its_hit_again_into_its_new_blocks() -> None:
    side = _side(HitLink(hit_chunks=3), **{"lmcache.mp.async_load": "false"})
    request = _request("f")
    assert _matched(side, request, 0) == (96, False)
    side.update_state_after_alloc(request, 96, None)
    assert len(side.build_connector_meta(_output([("f", BLOCKS, 0, 4)])).loads) == 1
    request.status = Status.PREEMPTED  # vLLM preempted it: its blocks are gone
    assert _matched(side, request, 0) == (96, False)
    side.update_state_after_alloc(request, 96, None)
    meta = side.build_connector_meta(_output(resumed=("f", [20, 21, 22, 23], 0, 4)))
    (load,) = meta.loads
    assert load.op.block_ids == ((20, 21, 22, 23),)


def test_request_reset_after_a_failed_async_load_is_recomputed_without_lmcache() -> None:
    side = _side(HitLink(hit_chunks=3))
    request = _request("g")
    assert _matched(side, request, 0) == (96, True)
    side.update_state_after_alloc(request, 96, [BLOCKS])
    assert len(side.build_connector_meta(_output()).loads) == 1
    # The worker reported the blocks invalid; vLLM freed them and asks again.
    assert _matched(side, request, 0) == (0, False)
    assert side._trackers["g"].state is LMCacheMPRequestState.BYPASS_LMCACHE
    assert _matched(side, request, 0) == (0, False)
    side.update_state_after_alloc(request, 0, None)
    meta = side.build_connector_meta(_output([("g", BLOCKS, 0, 100)]))
    assert meta.loads == []
    assert side._trackers["g"].state is LMCacheMPRequestState.READY


# Needs vLLM: the vllm-e2e nox session runs exactly these files (-m vllm).
pytestmark = pytest.mark.vllm
