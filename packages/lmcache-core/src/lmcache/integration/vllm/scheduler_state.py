"""Scheduler-side bookkeeping of ``LMCacheMPConnector``, free of vLLM imports.

Everything here is plain data and arithmetic so it can be unit-tested without vLLM:
which token range of a request to load from the server, which to store after a step, and
how a lookup's hit count becomes a number of tokens vLLM may skip.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence


class LMCacheMPRequestState(enum.Enum):
    PREFETCHING = "prefetching"  # lookup submitted, result pending
    WAITING_FOR_LOAD = "waiting_for_load"  # hit known; load not yet sent to the worker
    READY = "ready"  # nothing (more) to load
    BYPASS_LMCACHE = "bypass_lmcache"  # the server is down or the request opted out


@dataclasses.dataclass(frozen=True)
class LoadStoreOp:
    """A token range of one request and the engine blocks that hold it.

    ``block_ids[g]`` is the request's whole block table of KV group ``g`` (from token 0);
    ``skip_first_n_tokens`` tokens at the front are not overwritten on load (they are
    already computed locally, e.g. by vLLM's own prefix cache).
    """

    token_ids: tuple[int, ...]
    block_ids: tuple[tuple[int, ...], ...]
    start: int = 0
    end: int = 0
    skip_first_n_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class LMCacheMPRequestMetadata:
    request_id: str
    op: LoadStoreOp
    cache_salt: str = ""
    # A load the worker runs in the background and reports through ``get_finished``.
    async_load: bool = False


@dataclasses.dataclass
class LMCacheMPRequestTracker:
    """What the scheduler knows about one live request."""

    request_id: str
    prompt_len: int
    cache_salt: str = ""
    state: LMCacheMPRequestState = LMCacheMPRequestState.PREFETCHING
    lookup_submitted: bool = False
    refresh_pending: bool = False  # a repeated lookup is out (see SchedulerSide)
    hit_tokens: int | None = None  # server answer, before capping
    local_computed: int = 0  # tokens vLLM had locally when it asked for a match
    num_external: int = 0  # tokens vLLM agreed to load from LMCache
    load_emitted: bool = False
    load_async: bool = False  # vLLM was told the load is asynchronous
    block_ids: list[list[int]] = dataclasses.field(default_factory=list)
    stored_end: int = 0  # the server holds [0, stored_end) of this request


def usable_hit_tokens(
    hit_tokens: int,
    prompt_len: int,
    chunk_size: int,
    block_size: int = 1,
    async_load: bool = False,
) -> int:
    """The prefix vLLM may load.

    vLLM must compute at least the last prompt token itself (to get logits), so a hit on the
    whole prompt is reported one token short; :func:`load_op` still loads the whole last
    chunk (its key names all its tokens, a shorter one would miss) and vLLM's forward then
    rewrites that one token's KV.  For an async load vLLM allocates blocks only for the
    reported tokens: when the last token would start a block of its own, that block does
    not exist at load time, and the hit is cut back to the last chunk boundary instead.
    """
    hit = max(0, min(hit_tokens, prompt_len))
    if hit < prompt_len:
        return hit
    if prompt_len <= 1:
        return 0
    if async_load and (prompt_len - 1) % block_size == 0:
        return ((prompt_len - 1) // chunk_size) * chunk_size
    return prompt_len - 1


def store_range(
    tracker: LMCacheMPRequestTracker,
    computed_after_step: int,
    num_tokens_available: int,
    chunk_size: int,
    max_offload_tokens: int | None = None,
) -> tuple[int, int] | None:
    """``[start, end)`` to store after a step, or None.

    Full chunks are stored as the prefill advances; the trailing partial chunk only once
    every available token is computed.  ``start`` is always chunk-aligned (the server
    requires it), so a partial chunk stored earlier is rewritten in full later.
    """
    limit = min(computed_after_step, num_tokens_available)
    if max_offload_tokens is not None:
        limit = min(limit, max_offload_tokens)
    end = limit if limit >= num_tokens_available else (limit // chunk_size) * chunk_size
    if end <= tracker.stored_end:
        return None
    start = (tracker.stored_end // chunk_size) * chunk_size
    return start, end


def load_op(tracker: LMCacheMPRequestTracker, token_ids: Sequence[int]) -> LoadStoreOp | None:
    """The load this request still needs, or None."""
    if tracker.num_external <= 0 or tracker.load_emitted:
        return None
    end = tracker.local_computed + tracker.num_external
    if end == tracker.prompt_len - 1 and (tracker.hit_tokens or 0) >= tracker.prompt_len:
        end = tracker.prompt_len  # the whole last chunk (see usable_hit_tokens)
    return LoadStoreOp(
        token_ids=tuple(token_ids[:end]),
        block_ids=tuple(tuple(group) for group in tracker.block_ids),
        start=0,
        end=end,
        skip_first_n_tokens=tracker.local_computed,
    )


def blocks_of_range(block_ids: Sequence[int], start: int, end: int, block_size: int) -> set[int]:
    """Engine block ids holding tokens ``[start, end)`` (block table from token 0)."""
    if end <= start:
        return set()
    first = start // block_size
    last = -(-end // block_size)
    return {int(b) for b in block_ids[first:last]}
