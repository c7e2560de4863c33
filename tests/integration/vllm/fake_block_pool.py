"""A stand-in for vLLM's scheduler block pool, as lazy offload reads it (tests only).

It behaves as vLLM's ``BlockPool`` with prefix caching: a block keeps its prefix-cache
hash until it is taken from the head of the free queue (evicted), which resets it; a
finished request's blocks go back to the tail, last block first.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable

_hash_ids = itertools.count()


class FakePool:
    """Hashes per block and an LRU free queue (head = next evicted), as vLLM keeps them."""

    def __init__(self, num_blocks: int) -> None:
        self.hashes: dict[int, Hashable | None] = dict.fromkeys(range(num_blocks))
        self.free: list[int] = list(range(num_blocks))

    def allocate(self, n: int) -> list[int]:
        """Blocks for a new request: taken from the head, evicting what they cached."""
        taken, self.free = self.free[:n], self.free[n:]
        for block in taken:
            self.hashes[block] = None
        return taken

    def fill(self, blocks: list[int]) -> None:
        """The blocks became full: vLLM gives each a hash."""
        for block in blocks:
            self.hashes[block] = f"h{next(_hash_ids)}"

    def release(self, blocks: list[int]) -> None:
        """A finished request's blocks go to the tail, hashes kept (prefix cache)."""
        self.free.extend(reversed(blocks))

    def block_hash(self, block_id: int) -> Hashable | None:
        return self.hashes[block_id]

    def free_queue_head(self, depth: int) -> list[int]:
        return self.free[:depth]

    def num_free_blocks(self) -> int:
        return len(self.free)
