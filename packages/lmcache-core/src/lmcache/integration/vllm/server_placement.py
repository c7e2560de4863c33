"""Which server a worker or a lookup talks to under ``lmcache.mp.server_placement``.

``prefix`` placement (ours; :mod:`.multi_server`) puts each prefix on one server.
``rank`` placement (upstream LMCache 0.5.6's meaning of ``server_urls``) splits the TP
ranks into one contiguous block per server; the scheduler then asks every server through
a :class:`LinkGroup`.  ``auto`` (the default) is ``rank`` wherever the world size is a
multiple of the server count, as upstream requires, and ``prefix`` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmcache.integration.vllm.mp_client import ServerLink
    from lmcache.v1.multiprocess.worker.client import MPClient

# lmcache.mp.server_placement values (see the module docstring).
PLACEMENTS = ("auto", "prefix", "rank")
# Lookup answers combined over the servers of a LinkGroup: the hit every server has.
_SMALLEST_ANSWER = frozenset({"query_prefetch_status", "wait_prefetch_status"})


def resolve_placement(placement: str, world_size: int, n_servers: int) -> str:
    """``prefix`` or ``rank`` for this deployment; ``rank`` needs a world size that is a
    multiple of the server count (``auto`` falls back to ``prefix`` otherwise)."""
    if placement not in PLACEMENTS:
        raise ValueError(
            f"lmcache.mp.server_placement must be one of {PLACEMENTS}, got {placement!r}"
        )
    if n_servers <= 1:
        return "prefix"  # one server: the two placements are the same
    divisible = world_size % n_servers == 0
    if placement == "rank" and not divisible:
        raise ValueError(
            f"lmcache.mp.server_placement=rank splits the {world_size} TP rank(s) into one "
            f"block per server: the world size must be a multiple of the {n_servers} servers"
        )
    if placement == "auto":
        return "rank" if divisible else "prefix"
    return placement


def server_of_rank(rank: int, world_size: int, n_servers: int) -> tuple[int, int]:
    """Rank placement: (index of the rank's server, its rank among that server's workers).
    Ranks go to servers in contiguous blocks, as upstream assigns them to nodes."""
    per_server = world_size // n_servers
    if per_server < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of {world_size} over {n_servers} servers")
    return rank // per_server, rank % per_server


class LinkGroup:
    """Every server's link, seen by the scheduler side as one (rank placement).

    A call goes to each server in turn; a lookup's hit is the smallest answer (every
    server must hold its ranks' share of a chunk), pending while any server's is.  Any
    server failing fails the call: a miss, as upstream.
    """

    def __init__(self, links: Sequence[ServerLink]) -> None:
        if not links:
            raise ValueError("a link group needs at least one link")
        self.links = list(links)
        self.block_size = self.links[0].block_size

    @property
    def url(self) -> str:
        return ",".join(link.url for link in self.links)

    @property
    def ready(self) -> bool:
        return all(link.ready for link in self.links)

    @property
    def generation(self) -> int:
        # Each link's generation only grows, so the sum changes whenever any server restarts.
        return sum(link.generation for link in self.links)

    @property
    def chunk_size(self) -> int | None:
        sizes = [link.chunk_size for link in self.links]
        return None if None in sizes else sizes[0]

    def run(self, what: str, call: Callable[[MPClient], Any]) -> Any:
        answers = [link.run(what, call) for link in self.links]
        if what in _SMALLEST_ANSWER:
            return None if any(a is None for a in answers) else min(answers)
        return answers[0]
