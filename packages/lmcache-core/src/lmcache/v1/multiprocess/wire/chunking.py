"""How a key's token range maps to chunks and to engine blocks (shared by both sides).

* ``[start, end)`` is split into chunks of ``chunk_size`` tokens; ``start`` must be
  chunk-aligned and only the last chunk may be partial.
* Chunk ``i`` is named by the rolling prefix hash of the tokens up to its end (salted by
  ``cache_salt``), so a chunk key identifies its whole prefix.
* ``block_ids[g]`` is either the request's whole block table (from token 0) or exactly the
  blocks of ``[start, end)``; the length tells which.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

from lmcache.utils import NONE_HASH, chunk_hashes
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey


@dataclasses.dataclass(frozen=True)
class ChunkSpan:
    index: int  # position of the chunk inside [start, end)
    start: int  # first token of the chunk
    num_tokens: int
    chunk_hash: int


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def salt_prefix_hash(cache_salt: str) -> int:
    if not cache_salt:
        return NONE_HASH
    digest = hashlib.blake2b(cache_salt.encode(), digest_size=8, person=b"lmc-salt").digest()
    return int.from_bytes(digest, "little")


def validate_range(key: IPCCacheServerKey, chunk_size: int) -> None:
    if not 0 <= key.start <= key.end <= len(key.token_ids):
        raise ValueError(
            f"token range [{key.start}, {key.end}) is outside the {len(key.token_ids)} tokens"
        )
    if key.start % chunk_size:
        raise ValueError(f"start {key.start} is not a multiple of the chunk size {chunk_size}")


def plan_chunks(key: IPCCacheServerKey, chunk_size: int) -> list[ChunkSpan]:
    """The chunks of ``[key.start, key.end)``; raises ``ValueError`` on a bad range."""
    validate_range(key, chunk_size)
    hashes = chunk_hashes(
        key.token_ids[: key.end],
        chunk_size,
        save_unfull_chunk=True,
        prefix_hash=salt_prefix_hash(key.cache_salt),
    )
    first = key.start // chunk_size
    spans = []
    for position, chunk_index in enumerate(range(first, len(hashes))):
        begin = chunk_index * chunk_size
        spans.append(
            ChunkSpan(position, begin, min(chunk_size, key.end - begin), hashes[chunk_index])
        )
    return spans


def prefix_chunks(key: IPCCacheServerKey, chunk_size: int) -> list[ChunkSpan]:
    """Every chunk of ``[0, end)`` (lookups always count from the first token)."""
    end = key.end if key.end else len(key.token_ids)
    end = min(end, len(key.token_ids))
    return plan_chunks(
        IPCCacheServerKey(
            key.model_name, key.world_size, None, key.token_ids, 0, end, cache_salt=key.cache_salt
        ),
        chunk_size,
    )


def range_block_ids(block_ids: Sequence[int], start: int, end: int, block_size: int) -> list[int]:
    """The engine blocks holding ``[start, end)`` (see the module docstring)."""
    full_len = _ceil_div(end, block_size)
    range_len = _ceil_div(end - start, block_size) if end > start else 0
    ids = [int(b) for b in block_ids]
    if len(ids) >= full_len:
        return ids[start // block_size : full_len]
    if len(ids) == range_len:
        return ids
    raise ValueError(
        f"{len(ids)} block ids cannot cover tokens [{start}, {end}) with block size "
        f"{block_size}: pass the whole block table ({full_len}+ ids) or exactly the range "
        f"({range_len} ids)"
    )


def chunk_block_ids(
    range_ids: Sequence[int], spans: Sequence[ChunkSpan], chunk_size: int, block_size: int
) -> list[int]:
    """Block ids of the selected chunks, concatenated (each full chunk has its whole run)."""
    per_chunk = chunk_size // block_size
    selected: list[int] = []
    for span in spans:
        lo = span.index * per_chunk
        hi = lo + _ceil_div(span.num_tokens, block_size)
        selected.extend(range_ids[lo:hi])
    return selected


def hit_chunks_to_tokens(hit_chunks: int | None, chunk_size: int, num_tokens: int) -> int:
    """Tokens covered by ``hit_chunks`` prefix chunks of a ``num_tokens`` lookup.

    ``query_prefetch_status`` / ``wait_prefetch_status`` answer in chunks (as upstream
    LMCache); a trailing partial chunk counts as one, hence the clamp.
    """
    return min(max(0, int(hit_chunks or 0)) * chunk_size, num_tokens)
