"""Placement over several servers (``lmcache.integration.vllm.multi_server``), no vLLM.

The scheduler routes a request by its prompt, the workers route each load and store by
the op's tokens; these tests pin down that both always pick the same server.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lmcache.integration.vllm.mp_config import parse_extra_config
from lmcache.integration.vllm.multi_server import (
    WorkerRouter,
    check_same_chunk_size,
    placement_root,
    server_index,
)
from lmcache.integration.vllm.scheduler_state import (
    LMCacheMPRequestMetadata,
    LMCacheMPRequestTracker,
    LoadStoreOp,
    load_op,
    store_range,
    usable_hit_tokens,
)

URLS = ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"]
BLOCK, CHUNK = 16, 64


def _prompt(seed: int, length: int = 200) -> list[int]:
    return [(seed * 7919 + i * 31) % 32000 for i in range(length)]


def test_one_server_is_always_index_zero() -> None:
    assert server_index(_prompt(1), "", BLOCK, URLS[:1]) == 0
    assert server_index([], "", BLOCK, URLS[:1]) == 0


def test_placement_depends_only_on_the_first_block_and_the_salt() -> None:
    prompt = _prompt(3)
    index = server_index(prompt, "", BLOCK, URLS)
    # Anything after the first block (later chunks, generated tokens) does not move it.
    assert server_index([*prompt[:BLOCK], 1, 2, 3], "", BLOCK, URLS) == index
    assert server_index(prompt[:CHUNK], "", BLOCK, URLS) == index
    assert placement_root(prompt, BLOCK) == tuple(prompt[:BLOCK])
    salted = {server_index(prompt, f"tenant-{i}", BLOCK, URLS) for i in range(32)}
    assert salted == {0, 1}  # the salt takes part: tenants spread too


def test_prefixes_spread_over_all_servers() -> None:
    three = [*URLS, "tcp://127.0.0.1:5557"]
    counts = [0, 0, 0]
    for seed in range(300):
        counts[server_index(_prompt(seed), "", BLOCK, three)] += 1
    assert all(count > 50 for count in counts), counts


def test_adding_a_server_moves_only_prefixes_to_the_new_one() -> None:
    three = [*URLS, "tcp://127.0.0.1:5557"]
    for seed in range(200):
        before = server_index(_prompt(seed), "", BLOCK, URLS)
        after = server_index(_prompt(seed), "", BLOCK, three)
        assert after in (before, 2)


def test_invalid_arguments_raise() -> None:
    with pytest.raises(ValueError, match="no server URLs"):
        server_index([1], "", BLOCK, [])
    with pytest.raises(ValueError, match="block_size"):
        placement_root([1], 0)


@pytest.mark.parametrize("length", [5, 16, 40, 64, 100, 200])
def test_scheduler_and_worker_agree_for_every_load_and_store(length: int) -> None:
    """The ops the scheduler emits (scheduler_state) route like the request's prompt."""
    for seed in range(40):
        prompt = _prompt(seed, length)
        expected = server_index(prompt, "salt", BLOCK, URLS)
        tracker = LMCacheMPRequestTracker("r", prompt_len=length, cache_salt="salt")
        ends = []
        for computed in range(1, length + 1, 7):
            span = store_range(tracker, computed, length, CHUNK)
            if span is not None:
                tracker.stored_end = span[1]
                ends.append(span[1])
        tracker.hit_tokens = length  # the whole prompt hits, as the lookup reports it
        tracker.num_external = usable_hit_tokens(length, length, CHUNK, BLOCK)
        load = load_op(tracker, prompt)
        if load is not None:
            ends.append(load.end)
        for end in ends:
            assert server_index(prompt[:end], "salt", BLOCK, URLS) == expected


def test_worker_router_splits_by_server_in_order() -> None:
    prompts = [_prompt(seed) for seed in range(12)]
    items = [
        LMCacheMPRequestMetadata(f"r{i}", LoadStoreOp(tuple(p[:CHUNK]), ((0,),), 0, CHUNK))
        for i, p in enumerate(prompts)
    ]
    sides = [SimpleNamespace(), SimpleNamespace()]
    router = WorkerRouter(sides, URLS, BLOCK)  # type: ignore[arg-type]
    groups = router.split(items)
    flat = [item.request_id for index in sorted(groups) for item in groups[index]]
    assert sorted(flat) == sorted(item.request_id for item in items)
    for index, group in groups.items():
        ids = [int(item.request_id[1:]) for item in group]
        assert ids == sorted(ids)
        assert all(server_index(prompts[i], "", BLOCK, URLS) == index for i in ids)


def test_servers_with_different_chunk_sizes_are_refused() -> None:
    links = [
        SimpleNamespace(url=URLS[0], chunk_size=64),
        SimpleNamespace(url=URLS[1], chunk_size=32),
    ]
    with pytest.raises(ValueError, match="same --chunk-size"):
        check_same_chunk_size(links)  # type: ignore[arg-type]
    links[1].chunk_size = None  # not reachable yet: nothing to compare
    check_same_chunk_size(links)  # type: ignore[arg-type]


def test_server_urls_naming_a_server_twice_are_refused() -> None:
    with pytest.raises(ValueError, match="more than once"):
        parse_extra_config(
            {"lmcache.mp.server_urls": "127.0.0.1:5555,tcp://127.0.0.1:5555"}, env={}
        )
    cfg = parse_extra_config({"lmcache.mp.server_urls": URLS}, env={})
    assert cfg.server_urls == tuple(URLS)
