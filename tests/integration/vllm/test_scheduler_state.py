"""Scheduler arithmetic: usable hits, store ranges, load ops (no vLLM needed)."""

from __future__ import annotations

from lmcache.integration.vllm.scheduler_state import (
    LMCacheMPRequestTracker,
    blocks_of_range,
    load_op,
    store_range,
    usable_hit_tokens,
)


def test_usable_hit_keeps_the_last_prompt_token_for_vllm() -> None:
    assert usable_hit_tokens(0, 300, 64) == 0
    assert usable_hit_tokens(256, 300, 64) == 256
    # A full-prompt hit is reported one token short (vLLM computes the last token).
    assert usable_hit_tokens(300, 300, 64, 16) == 299
    assert usable_hit_tokens(256, 256, 64, 16) == 255
    assert usable_hit_tokens(256, 256, 64, 16, async_load=True) == 255
    assert usable_hit_tokens(1, 1, 64) == 0
    # Async, and the last token alone in its block: that block is not allocated at load
    # time, so the hit is cut back to the chunk boundary below it.
    assert usable_hit_tokens(257, 257, 64, 16, async_load=True) == 256
    assert usable_hit_tokens(257, 257, 64, 16) == 256  # sync: the step allocates it


def test_a_full_prompt_hit_loads_the_whole_last_chunk() -> None:
    tracker = LMCacheMPRequestTracker("r", prompt_len=300)
    tracker.hit_tokens = 300
    tracker.num_external = usable_hit_tokens(300, 300, 64, 16)
    tracker.block_ids = [list(range(19))]
    op = load_op(tracker, list(range(300)))
    assert op is not None and (op.end, op.skip_first_n_tokens) == (300, 0)
    assert op.token_ids == tuple(range(300))
    # A partial hit loads exactly what was reported.
    partial = LMCacheMPRequestTracker("p", prompt_len=300)
    partial.hit_tokens, partial.num_external = 256, 256
    assert (op2 := load_op(partial, list(range(300)))) is not None and op2.end == 256


def test_store_range_full_chunks_then_the_tail() -> None:
    tracker = LMCacheMPRequestTracker("r", prompt_len=300)
    assert store_range(tracker, 100, 300, 64) == (0, 64)
    tracker.stored_end = 64
    assert store_range(tracker, 120, 300, 64) is None
    assert store_range(tracker, 300, 300, 64) == (64, 300)
    tracker.stored_end = 300
    assert store_range(tracker, 301, 300, 64) is None
    # With decode tokens available, the partial chunk is rewritten from its start.
    assert store_range(tracker, 320, 330, 64) == (256, 320)


def test_store_range_respects_max_offload_tokens() -> None:
    tracker = LMCacheMPRequestTracker("r", prompt_len=300)
    assert store_range(tracker, 300, 300, 64, max_offload_tokens=130) == (0, 128)


def test_load_op_skips_locally_computed_tokens() -> None:
    tracker = LMCacheMPRequestTracker("r", prompt_len=300)
    tracker.local_computed, tracker.num_external = 64, 192
    tracker.block_ids = [[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]]
    op = load_op(tracker, list(range(300)))
    assert op is not None
    assert (op.start, op.end, op.skip_first_n_tokens) == (0, 256, 64)
    assert op.token_ids == tuple(range(256)) and op.block_ids[0][:2] == (9, 8)
    tracker.load_emitted = True
    assert load_op(tracker, list(range(300))) is None


def test_blocks_of_range() -> None:
    assert blocks_of_range([5, 6, 7, 8], 32, 96, 32) == {6, 7}
    assert blocks_of_range([5, 6, 7, 8], 0, 33, 32) == {5, 6}
    assert blocks_of_range([5, 6], 10, 10, 32) == set()
