"""The worker's side of the framed inline sub-path: chunk bytes as their own ZMQ frames.

A store gathers the KV blocks of each chunk into a staging buffer and sends the buffers
themselves as frames (zero-copy: ZeroMQ reads them while sending); a retrieve scatters
straight from the received frames (zero-copy views of ZeroMQ's message buffers) into the
KV pages.  No msgpack of chunk bytes, no joins: one gather and one scatter per side.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey, PrepareRetrieveResponse
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

    def take(self, count: int) -> list[torch.Tensor]:
        while len(self._buffers) < count:
            self._buffers.append(torch.empty(self._shape, dtype=self._dtype))
        return self._buffers[:count]

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
