"""Several cache servers behind one ``LMCacheMPConnector`` (``lmcache.mp.server_urls``).

Placement: every chunk of a token sequence lives on the server chosen by rendezvous
hashing of the sequence's *root*, its first ``block_size`` tokens (fewer when the
sequence is shorter) plus the cache salt.  Chunk keys are prefix-chained, so two
sequences that share any stored chunk share their first chunk, hence their root, hence
their server: the scheduler (which routes a lookup by the prompt) and the workers (which
route a load or store by the op's tokens) always pick the same server without talking to
each other, and a server's lookup (which counts hit chunks from token 0) sees the whole
prefix it is asked about.  Different prefixes (system prompts, documents, tenants) spread
over the servers; adding or removing a server moves only the prefixes that go to or come
from it (rendezvous hashing).

Spreading the chunks *of one prefix* over the servers instead would cut every prefix at
its first chunk on a dead server (almost every hit lost, not one server's share) and would
need a per-chunk lookup the server protocol does not have.

Each server has its own :class:`~.mp_client.ServerLink`, heartbeat, scheduler side and
worker side, so outage detection, restart and re-registration work per server: a dead
server turns only its prefixes into misses (one warning per outage), the others keep
serving.

That is *prefix* placement.  Upstream LMCache 0.5.6 places by *rank* instead, and so can
this connector (``lmcache.mp.server_placement``; ``auto``, the default, picks ``rank``
wherever upstream accepts the configuration): the TP ranks are split into one contiguous
block per server (``world_size % n_servers == 0``, typically one server per node), each
worker talks only to its block's server, which sees ``world_size / n_servers`` workers;
every chunk is on every server (each holding its ranks' share of the KV); the scheduler
asks every server (:class:`~.server_placement.LinkGroup`) and takes the smallest hit; one
dead server turns every lookup into a miss until it is back.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from lmcache.integration.vllm.scheduler_state import LMCacheMPRequestMetadata
from lmcache.v1.platform.ops_types import EngineKVFormat

if TYPE_CHECKING:
    import torch
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

    from lmcache.integration.vllm.lazy_offload import BlockPoolView
    from lmcache.integration.vllm.mp_client import ServerLink
    from lmcache.integration.vllm.scheduler_side import LMCacheMPConnectorMetadata, SchedulerSide
    from lmcache.integration.vllm.worker_side import WorkerSide

logger = logging.getLogger(__name__)


def placement_root(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """The tokens a sequence is placed by: its first ``block_size`` tokens.

    ``block_size`` divides the chunk size, so the root lies inside the first chunk and is
    shared by every sequence whose first chunk is the same.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return tuple(int(t) for t in token_ids[:block_size])


def server_index(
    token_ids: Sequence[int], cache_salt: str, block_size: int, server_urls: Sequence[str]
) -> int:
    """Index into ``server_urls`` of the server that holds ``token_ids``' chunks.

    Rendezvous hashing: the server whose (url, root, salt) digest is largest.  A stable
    digest (blake2b), not Python's ``hash``, because the scheduler and the workers are
    different processes.
    """
    if not server_urls:
        raise ValueError("no server URLs")
    if len(server_urls) == 1:
        return 0
    root = array("q", placement_root(token_ids, block_size)).tobytes()
    salt = cache_salt.encode()
    best, best_score = 0, -1
    for index, url in enumerate(server_urls):
        digest = hashlib.blake2b(digest_size=8)
        for part in (url.encode(), salt, root):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        score = int.from_bytes(digest.digest(), "little")
        if score > best_score:
            best, best_score = index, score
    return best


def check_same_chunk_size(links: Iterable[ServerLink]) -> None:
    """All reachable servers must use one chunk size (as upstream requires)."""
    sizes = {link.url: link.chunk_size for link in links if link.chunk_size is not None}
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"all LMCache servers in lmcache.mp.server_urls must use the same --chunk-size, "
            f"got {sizes}"
        )


class SchedulerRouter:
    """Sends each request to the scheduler side of the server that holds its prefix."""

    def __init__(
        self, sides: Sequence[SchedulerSide], server_urls: Sequence[str], block_size: int
    ) -> None:
        if len(sides) != len(server_urls):
            raise ValueError("one scheduler side per server URL")
        self.sides = list(sides)
        self.server_urls = list(server_urls)
        self.block_size = block_size

    def side_for(self, request: Request) -> SchedulerSide:
        index = server_index(
            request.prompt_token_ids or (),
            getattr(request, "cache_salt", None) or "",
            self.block_size,
            self.server_urls,
        )
        return self.sides[index]

    def bind_block_pool(self, pool: BlockPoolView) -> None:
        for side in self.sides:
            side.bind_block_pool(pool)

    def on_new_request(self, request: Request) -> None:
        self.side_for(request).on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.side_for(request).get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self,
        request: Request,
        num_external_tokens: int,
        block_ids: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.side_for(request).update_state_after_alloc(request, num_external_tokens, block_ids)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> LMCacheMPConnectorMetadata:
        """Every side plans the requests it tracks (it skips the others); one metadata."""
        merged = self.sides[0].build_connector_meta(scheduler_output)
        for side in self.sides[1:]:
            meta = side.build_connector_meta(scheduler_output)
            merged.loads.extend(meta.loads)
            merged.stores.extend(meta.stores)
            merged.held_requests.extend(meta.held_requests)
        return merged

    def finish(self, request: Request) -> bool:
        """True: vLLM keeps the request's blocks until the workers report it stored (the
        waiting requests of every side compete for vLLM's blocks)."""
        return self.side_for(request).finish(
            request.request_id, lambda: sum(s.waiting_blocks() for s in self.sides)
        )

    def close(self) -> None:
        for side in self.sides:
            side.close()


class WorkerRouter:
    """One worker side per server; loads and stores go to the server of their tokens."""

    def __init__(
        self, sides: Sequence[WorkerSide], server_urls: Sequence[str], block_size: int
    ) -> None:
        if len(sides) != len(server_urls):
            raise ValueError("one worker side per server URL")
        self.sides = list(sides)
        self.server_urls = list(server_urls)
        self.block_size = block_size

    def split(
        self, items: Iterable[LMCacheMPRequestMetadata]
    ) -> dict[int, list[LMCacheMPRequestMetadata]]:
        """``items`` grouped by server index, each group in its original order."""
        groups: dict[int, list[LMCacheMPRequestMetadata]] = {}
        for item in items:
            index = server_index(
                item.op.token_ids, item.cache_salt, self.block_size, self.server_urls
            )
            groups.setdefault(index, []).append(item)
        return groups

    def register_kv_caches(
        self, kv_caches: dict[str, torch.Tensor], num_kv_heads: int, head_size: int
    ) -> None:
        for side in self.sides:
            side.register_kv_caches(kv_caches, num_kv_heads, head_size)

    def load(self, loads: list[LMCacheMPRequestMetadata]) -> None:
        for index, items in self.split(loads).items():
            self.sides[index].load(items)

    def store(self, stores: list[LMCacheMPRequestMetadata]) -> None:
        for index, items in self.split(stores).items():
            self.sides[index].store(items)

    @property
    def rank(self) -> int:
        """This worker's TP rank (the same on every server)."""
        return self.sides[0].rank

    @property
    def kv_layout(self) -> EngineKVFormat | None:
        return self.sides[0].kv_layout

    def finished_loads(self) -> set[str]:
        """Requests whose async load ended on any server (a request loads from one)."""
        finished: set[str] = set()
        for side in self.sides:
            finished |= side.finished_loads()
        return finished

    def take_load_errors(self) -> set[int]:
        errors: set[int] = set()
        for side in self.sides:
            errors |= side.take_load_errors()
        return errors

    def close(self) -> None:
        for side in self.sides:
            side.close()
