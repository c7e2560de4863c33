"""The per-request records SGLang's ``LMCacheUnifiedRadixCache`` keeps for LMCache.

SGLang 0.5.23 imports :class:`LMCacheExternalFlow` and :class:`LMCachePendingStore` from
here and reads and writes their fields by name; the operation records are what
:class:`~lmcache.integration.sglang.unified_lmcache_mp_connector.UnifiedLMCacheMPConnector`
hands back from its ``submit_*`` calls.  Upstream LMCache 0.5.6's names and fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass
class LMCacheLookupOperation:
    """One request's lookup; after ``poll_lookup`` its hit and the read locks it holds."""

    request_id: str
    token_ids: list[int]
    local_hit_tokens: int
    cache_salt: str
    submission_future: Any = None
    completion_future: Any = None
    total_hit_tokens: int | None = None
    locks_held: bool = False
    # The first token whose read lock is still held (locks are released front to back).
    lock_start: int = 0


@dataclasses.dataclass(frozen=True)
class SGLangKVComponentGroup:
    """One SGLang KV address space (a tree component), registered as one engine group."""

    name: str
    kv_tensors: tuple[torch.Tensor, ...]
    sliding_window_size: int = -1
    tokens_per_block: int = 0
    slots_per_block: int = 0
    tensor_rows_per_block: tuple[int, ...] = ()
    recurrent_state: bool = False


class _Operation:
    """Readiness shared by loads and stores: ``future`` is a ``QueryableFuture``."""

    future: Any
    result: bool | None

    def query(self) -> bool:
        """Whether the transfer has ended (successfully or not); never waits."""
        return self.result is not None or bool(self.future.query())


@dataclasses.dataclass
class LMCacheLoadOperation(_Operation):
    """A retrieve of ``[start, end)`` into ``device_indices`` (SGLang's token slots)."""

    request_id: str
    token_ids: list[int]
    start: int
    end: int
    local_hit_tokens: int
    device_indices: torch.Tensor
    future: Any
    lookup: LMCacheLookupOperation
    result: bool | None = None


@dataclasses.dataclass
class LMCacheStoreOperation(_Operation):
    """A store of ``[start, end)`` of one request."""

    request_id: str
    start: int
    end: int
    future: Any
    result: bool | None = None


@dataclasses.dataclass
class LMCacheExternalFlow:
    """SGLang's state of one request's LMCache hit, from lookup to published prefix."""

    key: Any  # sglang RadixKey
    lookup: LMCacheLookupOperation
    total_hit: int | None = None
    local_hit_tokens: int | None = None
    load: LMCacheLoadOperation | None = None
    anchor_node: Any = None  # sglang NodeId
    anchor_lock: Any = None  # sglang DecLockRefParams
    mamba_value: torch.Tensor | None = None
    request_mamba_value: torch.Tensor | None = None
    allocated_request_mamba_for_load: bool = False
    load_req: Any = None  # sglang Req
    free_mamba_after_load: bool = False
    loaded_skip_tokens: int = 0
    released_skip_tokens: int = 0
    prefix_published: bool = False
    load_completed: bool = False
    retire_requested: bool = False
    cancelled: bool = False


@dataclasses.dataclass
class LMCachePendingStore:
    """A submitted store and the radix-tree lock SGLang holds until it completes."""

    operation: LMCacheStoreOperation
    node_id: Any  # sglang NodeId
    lock_params: Any  # sglang DecLockRefParams
