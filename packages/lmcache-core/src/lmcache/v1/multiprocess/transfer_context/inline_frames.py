"""The worker's side of the framed inline sub-path: chunk bytes as their own ZMQ frames.

A store gathers the KV blocks of each chunk into a staging buffer and sends the buffers
themselves as frames (zero-copy: ZeroMQ reads them while sending); a retrieve scatters
straight from the received frames (zero-copy views of ZeroMQ's message buffers) into the
KV pages.  No msgpack of chunk bytes, no joins: one gather and one scatter per side.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lmcache.v1.multiprocess.wire.chunking import ChunkSpan, chunk_block_ids
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey, PrepareRetrieveResponse
from lmcache.v1.multiprocess.wire.protocol import INLINE_GROUP_BYTES
from lmcache.v1.platform.kv_layout import KVLayout

logger = logging.getLogger(__name__)

COMMIT_STORE_FRAMES = "commit_store_frames"
RETRIEVE_FRAMES = "retrieve_frames"


class InlineFrameError(ValueError):
    """The server's framed reply does not match what was asked."""


class StagingBuffers:
    """Reused chunk-sized staging tensors for stores.

    A buffer is reused only after the server answered the request that sent it, so ZeroMQ
    has finished reading it; after a failed request the buffers are abandoned (ZeroMQ may
    still hold them) and fresh ones are made.
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self._shape = shape
        self._dtype = dtype
        self._buffers: list[torch.Tensor] = []

    def take(self, count: int, offset: int = 0) -> list[torch.Tensor]:
        """Buffers ``offset .. offset + count`` (a pipeline gives each in-flight request
        its own range)."""
        while len(self._buffers) < offset + count:
            self._buffers.append(torch.empty(self._shape, dtype=self._dtype))
        return self._buffers[offset : offset + count]

    def abandon(self) -> None:
        self._buffers = []


def byte_frames(tensors: list[torch.Tensor]) -> list[Any]:
    """Zero-copy byte views (numpy arrays: buffers ZeroMQ sends) of contiguous CPU tensors."""
    return [t.view(torch.uint8).reshape(-1).numpy() for t in tensors]


def send_store_frames(
    client: Any,
    key: IPCCacheServerKey,
    instance_id: int,
    indices: list[int],
    staging: StagingBuffers,
    count: int,
) -> bool:
    """``commit_store_frames`` of the first ``count`` staging buffers (already gathered)."""
    buffers = staging.take(count)
    try:
        ok, _ = client.call_bulk(
            COMMIT_STORE_FRAMES, key, instance_id, indices, frames=byte_frames(buffers)
        )
    except BaseException:
        staging.abandon()
        raise
    return bool(ok)


def receive_retrieve_frames(
    client: Any, key: IPCCacheServerKey, instance_id: int, layout: KVLayout, chunk_size: int,
    expected_chunks: int,
) -> list[torch.Tensor] | None:  # fmt: skip
    """``retrieve_frames``: the chunks as tensors viewing the received frames (no copy),
    ``None`` on a miss; ``InlineFrameError`` when the reply is not the chunks asked for."""
    response, frames = client.call_bulk(RETRIEVE_FRAMES, key, instance_id)
    return frames_as_chunks(response, frames, layout, chunk_size, expected_chunks)


def frames_as_chunks(
    response: Any, frames: list[memoryview], layout: KVLayout, chunk_size: int,
    expected_chunks: int,
) -> list[torch.Tensor] | None:  # fmt: skip
    """A ``retrieve_frames`` reply as chunk tensors viewing its frames (``None``: a miss)."""
    assert isinstance(response, PrepareRetrieveResponse)
    if not response.success:
        return None
    nbytes = layout.chunk_nbytes(chunk_size)
    if len(frames) != expected_chunks or any(f.nbytes != nbytes for f in frames):
        raise InlineFrameError(
            f"retrieve_frames answered {len(frames)} frames of "
            f"{sorted({f.nbytes for f in frames})} bytes; expected {expected_chunks} "
            f"of {nbytes}"
        )
    shape = layout.transfer_shape(chunk_size)
    return [torch.frombuffer(f, dtype=layout.dtype).view(shape) for f in frames]


# Requests of one store/retrieve in flight at once: while one travels (and the server
# copies it), the worker gathers the next (store) or scatters the previous (retrieve).
PIPELINE_DEPTH = 2
# A pipelined request carries at least this many bytes (whole chunks): smaller requests
# would spend more on round trips than the overlap wins.  The server's default request
# limit is sized from it (one group plus one chunk), so it is the wire's constant.
PIPELINE_GROUP_BYTES = INLINE_GROUP_BYTES

# (objects, block ids, skip_blocks) -> the gather/scatter of the selected backend's ops.
Transfer = Callable[[list[torch.Tensor], list[int], int], None]


def chunk_groups(num_chunks: int, chunk_nbytes: int, group_bytes: int) -> list[range]:
    """Consecutive chunk positions, split into requests of at least ``group_bytes``."""
    per_group = max(1, -(-group_bytes // max(1, chunk_nbytes)))
    return [range(lo, min(lo + per_group, num_chunks)) for lo in range(0, num_chunks, per_group)]


def group_key(
    key: IPCCacheServerKey, spans: Sequence[ChunkSpan], group: range
) -> IPCCacheServerKey:
    """The key of one group's token range (chunk hashes stay those of the whole key: a
    chunk is named by its prefix, and the token ids are the same)."""
    first, last = spans[group.start], spans[group.stop - 1]
    return dataclasses.replace(key, start=first.start, end=last.start + last.num_tokens)


def group_block_ids(
    ids: Sequence[int], spans: Sequence[ChunkSpan], group: range, key_start: int, block_size: int
) -> list[int]:
    """The blocks of one group's tokens, out of the whole range's block ids."""
    first, last = spans[group.start], spans[group.stop - 1]
    lo = (first.start - key_start) // block_size
    hi = -(-(last.start + last.num_tokens - key_start) // block_size)
    return list(ids[lo:hi])


def pipelined_retrieve(
    client: Any, key: IPCCacheServerKey, instance_id: int, layout: KVLayout, chunk_size: int,
    spans: Sequence[ChunkSpan], ids: Sequence[int], skip_blocks: int, transfer: Transfer,
) -> bool:  # fmt: skip
    """``retrieve_frames`` per chunk group, ``PIPELINE_DEPTH`` in flight: each group is
    scattered from its received frames while the next one travels.

    False if any group missed.  Unlike the one-request retrieve, the groups that did hit
    have then been written into their blocks: the blocks belong to this request's range,
    which the engine recomputes after a failed retrieve, so nothing else is touched."""
    groups = chunk_groups(len(spans), layout.chunk_nbytes(chunk_size), PIPELINE_GROUP_BYTES)
    hits = [False] * len(groups)

    def request(i: int) -> tuple[Sequence[Any], Sequence[Any]]:
        return (group_key(key, spans, groups[i]), instance_id), ()

    def scatter(i: int, response: Any, frames: list[memoryview]) -> None:
        chunks = frames_as_chunks(response, frames, layout, chunk_size, len(groups[i]))
        if chunks is None:
            return
        group_ids = group_block_ids(ids, spans, groups[i], key.start, layout.block_size)
        # skip_blocks counts from the range's first block; this group starts further in.
        first_block = (spans[groups[i].start].start - key.start) // layout.block_size
        skip = min(max(0, skip_blocks - first_block), len(group_ids))
        transfer(chunks, group_ids, skip)
        hits[i] = True

    client.call_bulk_pipelined(RETRIEVE_FRAMES, len(groups), request, scatter, depth=PIPELINE_DEPTH)
    return all(hits)


def pipelined_store(
    client: Any, key: IPCCacheServerKey, instance_id: int, layout: KVLayout, chunk_size: int,
    spans: Sequence[ChunkSpan], ids: Sequence[int], staging: StagingBuffers, transfer: Transfer,
) -> bool:  # fmt: skip
    """``prepare_store`` per chunk group, then ``commit_store_frames`` per group with
    ``PIPELINE_DEPTH`` in flight: each group is gathered into its own staging buffers
    while the previous one travels."""
    groups = chunk_groups(len(spans), layout.chunk_nbytes(chunk_size), PIPELINE_GROUP_BYTES)
    keys = [group_key(key, spans, g) for g in groups]
    todo: list[list[int]] = []
    for sub in keys:
        context = client.prepare_store(sub, instance_id).context
        todo.append([int(i) for i in context.get("chunk_indices", [])])
    per_group = max(len(g) for g in groups)
    results = [False] * len(groups)

    def request(i: int) -> tuple[Sequence[Any], Sequence[Any]]:
        group = groups[i]
        sub_spans = [spans[group.start + j] for j in todo[i]]
        buffers = staging.take(len(sub_spans), (i % PIPELINE_DEPTH) * per_group)
        if sub_spans:
            group_ids = group_block_ids(ids, spans, group, key.start, layout.block_size)
            local = [dataclasses.replace(s, index=s.index - group.start) for s in sub_spans]
            transfer(buffers, chunk_block_ids(group_ids, local, chunk_size, layout.block_size), 0)
        return (keys[i], instance_id, todo[i]), byte_frames(buffers)

    def committed(i: int, response: Any, frames: list[memoryview]) -> None:
        results[i] = bool(response)

    try:
        client.call_bulk_pipelined(
            COMMIT_STORE_FRAMES, len(groups), request, committed, depth=PIPELINE_DEPTH
        )
    except BaseException:
        staging.abandon()  # ZeroMQ may still read buffers of requests left in flight
        raise
    return all(results)
