"""Data types that travel between inference workers and the MP cache server.

Everything here is a ``msgspec.Struct`` or a plain dataclass msgspec encodes natively, so
the wire never carries pickles.  Names and fields follow upstream LMCache 0.5.6.

Every number and length that arrives on the wire is bounded here, once, with msgspec
``Meta`` constraints: the decoder refuses an out-of-range field (naming it) before any
handler runs, so no request can make the server loop over, allocate or hash more than
these bounds allow.  Python callers constructing these types are not checked; the server is.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Any

import msgspec
from msgspec import Meta

__all__ = [
    "PrefetchProgress",
    "BlockAllocationRecord",
    "BlockId",
    "BlockIdList",
    "BlockIds",
    "EngineGroupInfo",
    "EngineType",
    "Handle",
    "IPCCacheServerKey",
    "InlineChunks",
    "InstanceId",
    "Int64",
    "KV_EVENT_CAPABILITY",
    "KV_EVENT_KIND_REMOVED",
    "KV_EVENT_KIND_STORED",
    "KV_EVENT_MEDIUM_CPU",
    "KVEventBatch",
    "KVEventRecord",
    "MAX_KV_EVENTS_PER_BATCH",
    "MAX_BLOCK_ID",
    "MAX_BLOCK_SIZE",
    "MAX_CACHE_SALT_LEN",
    "MAX_HANDLE_BYTES",
    "MAX_HIDDEN_DIM",
    "MAX_KV_GROUPS",
    "MAX_KV_READERS",
    "MAX_LAYERS",
    "MAX_NAME_LEN",
    "MAX_RECORDS",
    "MAX_TIMEOUT_S",
    "MAX_TOKENS",
    "MAX_WORLD_SIZE",
    "MAX_OBJECT_NAME_LEN",
    "MAX_OBJECTS",
    "MAX_SHARD_LEN",
    "Name",
    "ObjectName",
    "ObjectNames",
    "ObjectScope",
    "PrepareRetrieveResponse",
    "PrepareStoreResponse",
    "Rank",
    "RegisterEngineDrivenContextPayload",
    "RegisterEngineDrivenContextResponse",
    "Salt",
    "ServerStats",
    "ShmSlotDescriptor",
    "Timeout",
    "TokenCount",
    "TokenIds",
    "WorldSize",
    "validate_cache_salt",
]

_FORBIDDEN_SALT_CHARS = frozenset("@/\\\x00")
MAX_CACHE_SALT_LEN = 128

# -- wire bounds (see the module docstring) --------------------------------------------------
MAX_WORLD_SIZE = 1024  # TP/PP ranks of one model instance
MAX_TOKENS = 1 << 22  # tokens of one request (4,194,304)
MAX_BLOCK_ID = (1 << 31) - 1
MAX_KV_GROUPS = 64  # block-id lists (KV cache groups) of one request
MAX_LAYERS = 4096
MAX_BLOCK_SIZE = 1 << 16  # tokens per engine block
MAX_HIDDEN_DIM = 1 << 24  # num_heads * head_size of one layer
MAX_NAME_LEN = 1024  # model names, request ids, engine types
MAX_HANDLE_BYTES = 64 * 1024  # event handles
MAX_RECORDS = 1 << 16  # block-allocation records of one report
MAX_TIMEOUT_S = 3600.0
MAX_KV_READERS = 1 << 16
# Named objects (``put_objects`` / ``get_objects`` / ``count_object_prefix``): names of
# one request (SGLang's HiCache sends at most 128 pages per call), the length of a name
# (SGLang's are a 64-character SHA-256 hex digest plus a pool suffix) and of a shard.
MAX_OBJECTS = 4096
MAX_OBJECT_NAME_LEN = 512
MAX_SHARD_LEN = 256

Int64 = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
InstanceId = Int64  # a dict key only; upstream and lmcache-core pick random 62-bit ids
WorldSize = Annotated[int, Meta(ge=1, le=MAX_WORLD_SIZE)]
Rank = Annotated[int, Meta(ge=0, lt=MAX_WORLD_SIZE)]
TokenCount = Annotated[int, Meta(ge=0, le=MAX_TOKENS)]
TokenIds = Annotated[tuple[Int64, ...], Meta(max_length=MAX_TOKENS)]
BlockId = Annotated[int, Meta(ge=0, le=MAX_BLOCK_ID)]
BlockIdList = Annotated[list[BlockId], Meta(max_length=MAX_TOKENS)]
BlockIds = Annotated[list[BlockIdList], Meta(max_length=MAX_KV_GROUPS)]
Name = Annotated[str, Meta(max_length=MAX_NAME_LEN)]
Handle = Annotated[bytes, Meta(max_length=MAX_HANDLE_BYTES)]
Timeout = Annotated[float, Meta(ge=0.0, le=MAX_TIMEOUT_S)]
Salt = Annotated[str, Meta(max_length=MAX_CACHE_SALT_LEN)]
ObjectName = Annotated[str, Meta(min_length=1, max_length=MAX_OBJECT_NAME_LEN)]
ObjectNames = Annotated[list[ObjectName], Meta(max_length=MAX_OBJECTS)]


class EngineType(str, enum.Enum):
    """The inference engine that owns a registered KV cache."""

    VLLM = "vllm"
    SGLANG = "sglang"
    DEFAULT = "default"


@dataclasses.dataclass(order=True, frozen=True)
class IPCCacheServerKey:
    """Names a token range of one request on one worker (``worker_id`` = TP rank).

    ``token_ids`` is the request's token prefix; ``[start, end)`` is the range to act on.
    ``worker_id`` is ``None`` for a lookup on behalf of a whole TP group.
    """

    model_name: Name
    world_size: WorldSize
    worker_id: Rank | None
    token_ids: TokenIds
    start: TokenCount
    end: TokenCount
    request_id: Name = dataclasses.field(default="", compare=False)
    cache_salt: Salt = ""
    request_configs: dict[Name, Any] | None = dataclasses.field(default=None, compare=False)
    num_kv_readers: Annotated[int, Meta(ge=0, le=MAX_KV_READERS)] = dataclasses.field(
        default=0, compare=False
    )

    def __post_init__(self) -> None:
        validate_cache_salt(self.cache_salt)

    @staticmethod
    def from_token_ids(
        model_name: str,
        world_size: int,
        worker_id: int | None,
        token_ids: Any,
        start: int = 0,
        end: int = 0,
        request_id: str = "",
        cache_salt: str = "",
        num_kv_readers: int = 1,
        request_configs: dict[str, Any] | None = None,
    ) -> IPCCacheServerKey:
        tokens = tuple(int(t) for t in token_ids)
        return IPCCacheServerKey(
            model_name=model_name,
            world_size=world_size,
            worker_id=worker_id,
            token_ids=tokens,
            start=start,
            end=end if end else len(tokens),
            request_id=request_id,
            cache_salt=cache_salt,
            request_configs=request_configs,
            num_kv_readers=num_kv_readers,
        )

    def no_worker_id_version(self) -> IPCCacheServerKey:
        return dataclasses.replace(self, worker_id=None)

    def require_num_kv_readers(self) -> int:
        if self.num_kv_readers < 1:
            raise ValueError(f"num_kv_readers must be >= 1, got {self.num_kv_readers}")
        return self.num_kv_readers


def validate_cache_salt(salt: str) -> None:
    if len(salt) > MAX_CACHE_SALT_LEN:
        raise ValueError(f"cache_salt longer than {MAX_CACHE_SALT_LEN} characters")
    bad = _FORBIDDEN_SALT_CHARS.intersection(salt)
    if bad:
        raise ValueError(f"cache_salt may not contain {sorted(bad)!r}")


class ObjectScope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Whose named objects a request acts on: a model's rank, a tenant and a shard.

    Named objects are opaque byte strings stored under a client-chosen name (an engine's
    page hash), not token chunks: two scopes that differ in any field never see each
    other's objects.  ``shard`` names whatever else makes the bytes differ (pipeline
    stage, page layout, dtype: the client's choice); ``cache_salt`` is the tenant, as in
    chunk keys.
    """

    model_name: Name
    world_size: WorldSize
    worker_id: Rank
    cache_salt: Salt = ""
    shard: Annotated[str, Meta(max_length=MAX_SHARD_LEN)] = ""

    def __post_init__(self) -> None:
        # Raised while decoding, these become the request's ``bad_payload`` reply.
        validate_cache_salt(self.cache_salt)
        if self.worker_id >= self.world_size:
            raise ValueError(
                f"worker_id {self.worker_id} is not a rank of world size {self.world_size}"
            )


class RegisterEngineDrivenContextPayload(msgspec.Struct):
    instance_id: InstanceId
    model_name: Name
    world_size: WorldSize
    block_size: Annotated[int, Meta(ge=1, le=MAX_BLOCK_SIZE)]
    num_layers: Annotated[int, Meta(ge=1, le=MAX_LAYERS)]
    hidden_dim_size: Annotated[int, Meta(ge=1, le=MAX_HIDDEN_DIM)]
    dtype_str: Annotated[str, Meta(max_length=64)]
    use_mla: bool
    num_physical_slots: Annotated[int, Meta(ge=0, le=MAX_BLOCK_ID)] | None = None


class RegisterEngineDrivenContextResponse(msgspec.Struct):
    shm_name: str = ""
    pool_size: int = 0


class PrepareStoreResponse(msgspec.Struct):
    context: dict[str, Any] = {}


class PrepareRetrieveResponse(msgspec.Struct):
    success: bool
    data: bytes = b""
    context: dict[str, Any] = {}


class BlockAllocationRecord(msgspec.Struct):
    """Upstream's per-request engine block-allocation delta (``report_block_allocation``)."""

    req_id: Name
    new_block_ids: BlockIdList
    new_token_ids: Annotated[list[Int64], Meta(max_length=MAX_TOKENS)]


class EngineGroupInfo(msgspec.Struct, frozen=True):
    """Upstream's description of one LMCache KV group (``register_kv_cache``'s
    ``engine_group_infos`` items): layers of one engine group sharing a copy kernel.

    Several infos may share an ``engine_group_id`` when one engine group splits by
    physical geometry. Every field but ``engine_group_id`` defaults, so older payloads
    decode. Helpers over a ``list[EngineGroupInfo]`` are in
    :mod:`lmcache.compat.upstream_056.group_view`.

    Attributes:
        engine_group_id: the engine's paged-block address space the layers live in
            (dense from 0); it selects the request's block-id list.
        layer_indices: registered KV tensor indices of this group.
        tokens_per_block: tokens one engine block of the group covers; 0 = not
            reported (the group is then taken as uncompressed).
        sw_size_tokens: sliding-window size in tokens; -1 = no sliding window.
        extra_object_group_tag: 0 for a regular group; > 0 tags an extra group (e.g.
            CacheBlend's fused auxiliary pool) placed after the regular ones.
        recurrent_state: the pages hold recurrent-state snapshots (Mamba/GDN), not
            attention KV.
    """

    engine_group_id: Annotated[int, Meta(ge=0, lt=MAX_KV_GROUPS)]
    layer_indices: Annotated[
        tuple[Annotated[int, Meta(ge=0, lt=MAX_LAYERS)], ...], Meta(max_length=MAX_LAYERS)
    ] = ()
    tokens_per_block: Annotated[int, Meta(ge=0, le=MAX_TOKENS)] = 0
    sw_size_tokens: Annotated[int, Meta(ge=-1, le=MAX_TOKENS)] = -1
    extra_object_group_tag: Annotated[int, Meta(ge=0, lt=MAX_KV_GROUPS)] = 0
    recurrent_state: bool = False


class ShmSlotDescriptor(msgspec.Struct):
    """One chunk's place in the server's shared-memory pool (byte offset and shape)."""

    offset: int
    length: int
    shape: list[int]
    dtype: str


class InlineChunks(msgspec.Struct, forbid_unknown_fields=True):
    """The engine-driven *inline* sub-path's ``data``: raw chunk bytes, in chunk order.

    Replaces upstream's pickled list of tensors; shapes and dtype are known to both sides
    from the registered context, so bytes are enough.
    """

    chunk_indices: list[int]
    chunks: list[bytes]


class PrefetchProgress(msgspec.Struct, frozen=True):
    """Progress of one lookup session's background promotion into L1 (chunks over all
    ranks): the answer of ``query_prefetch_progress``."""

    request_id: str
    total_chunks: int
    done_chunks: int  # finished: promoted or failed
    failed_chunks: int
    finished: bool


class ServerStats(msgspec.Struct):
    """Counters read by tests, the benchmark and ``lmcache demo``."""

    stored_tokens: int = 0
    retrieved_tokens: int = 0
    stored_chunks: int = 0
    retrieved_chunks: int = 0
    lookup_hit_tokens: int = 0
    l1_chunks: int = 0
    l1_used_bytes: int = 0
    l1_capacity_bytes: int = 0
    lmcache_driven_workers: int = 0
    engine_driven_workers: int = 0
    pending_prepares: int = 0
    errors: int = 0
    dropped_replies: int = 0
    supported_transfer_mode: str = ""
    shm_name: str = ""
    chunk_size: int = 0
    # A random id drawn when the server process starts: a client that sees it change knows
    # the server restarted and forgot every registration and lookup session.  Optional (an
    # older server sends none, decoded as ""), so adding it breaks no peer.
    server_incarnation: str = ""
    # Named objects stored and sent (``put_objects`` / ``get_objects``); optional too.
    stored_objects: int = 0
    retrieved_objects: int = 0


# -- KV events (``subscribe_kv_events``) -------------------------------------------------------

# What ``get_experimental`` lists when the server records KV events (upstream's name).
KV_EVENT_CAPABILITY = "kv_event_stream"
KV_EVENT_KIND_STORED = "stored"
KV_EVENT_KIND_REMOVED = "removed"
# The only medium the server reports: its host-memory tier (L1).
KV_EVENT_MEDIUM_CPU = "CPU"
# The most records one batch may carry (upstream's bound on ``max_events``).
MAX_KV_EVENTS_PER_BATCH = 1024


class KVEventRecord(msgspec.Struct):
    """One sequenced change of the server's CPU tier for one model.

    ``stored`` records carry one chunk: its hash, its parent's (the previous chunk of the
    same prefix, ``None`` for the first) and its tokens.  ``removed`` records may carry
    several hashes.  Hashes are the chunk hashes as 8 big-endian bytes.
    """

    seq: int
    kind: str
    medium: str
    model_name: str
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]


class KVEventBatch(msgspec.Struct):
    """One page of a model's KV events after a cursor.

    Resume at ``next_cursor``.  ``lost`` means records after the cursor were dropped from
    the bounded log (or the cursor is from another incarnation): the subscriber must
    forget what it learnt and rebuild from the events that follow.  ``incarnation``
    changes when the server restarts; ``enabled=False`` means the server records none.
    """

    enabled: bool
    incarnation: int
    next_cursor: int
    lost: bool
    events: list[KVEventRecord]
