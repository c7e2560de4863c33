"""The inline sub-path's chunk codec: chunk bytes inside the messages, as msgpack.

Used by engine-driven workers when the server has no shared memory.  The data is an
:class:`~lmcache.v1.multiprocess.wire.custom_types.InlineChunks` struct, never a pickle:
pickled data (upstream LMCache's pickle sub-path) is refused by its first byte.
"""

from __future__ import annotations

import msgspec
import torch

from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.multiprocess.wire.custom_types import InlineChunks
from lmcache.v1.multiprocess.wire.protocol import ErrorCode, ProtocolError

# Every pickle protocol >= 2 starts with the PROTO opcode.
_PICKLE_PROTO = b"\x80"


def fill_inline(objs: list[MemoryObj], indices: list[int], data: bytes, nbytes: int) -> None:
    """Copy ``commit_store``'s inline ``data`` into the prepared ``objs`` (``nbytes`` each);
    raises ``ProtocolError`` unless it holds exactly the chunks ``indices`` prepared."""
    if data[:1] == _PICKLE_PROTO:
        raise ProtocolError(
            ErrorCode.BAD_PAYLOAD,
            "pickled commit_store data is refused (lmcache-core never unpickles; upstream "
            "LMCache's pickle sub-path is unsupported): use the SHM sub-path or "
            "lmcache-core's inline format",
        )
    try:
        chunks = msgspec.msgpack.decode(data, type=InlineChunks)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"bad inline chunk data: {exc}") from None
    if chunks.chunk_indices != indices or len(chunks.chunks) != len(objs):
        raise ProtocolError(
            ErrorCode.BAD_PAYLOAD,
            f"inline data holds chunks {chunks.chunk_indices}, prepare_store asked for {indices}",
        )
    for raw, obj in zip(chunks.chunks, objs):
        if len(raw) != nbytes:
            raise ProtocolError(
                ErrorCode.SHAPE_MISMATCH,
                f"inline chunk has {len(raw)} bytes, expected {nbytes}",
            )
        target = obj.raw_tensor
        assert target is not None
        target[:nbytes].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))


def encode_inline(objs: list[MemoryObj], indices: list[int], nbytes: int) -> bytes:
    """``prepare_retrieve``'s inline data: the first ``nbytes`` of each object."""
    chunks = []
    for obj in objs:
        raw = obj.raw_tensor
        assert raw is not None
        chunks.append(raw[:nbytes].numpy().tobytes())
    return msgspec.msgpack.encode(InlineChunks(chunk_indices=indices, chunks=chunks))
