"""The MP wire protocol: msgspec MessagePack frames over ZeroMQ ROUTER/DEALER.

Request (client DEALER)::

    [msgpack(request_uid: int), msgpack(operation: int | str), *msgpack(payload_i)]

The ROUTER prepends the client identity.  A success reply is ``[uid, op]`` plus one frame
``msgpack(response)`` unless the response is ``None``.  A failure reply is
``[uid, msgpack("__error__ <code>: <message>"), msgpack(ErrorReply)]`` -- every request the
server can frame gets exactly one reply, and nothing is ever pickled or unpickled.  The
op frame of a failure starts with ``ERROR_OPERATION`` and repeats code and message because
upstream LMCache's client reads only that frame: it raises
``ValueError("Response operation '__error__ <code>: <message>' does not match request
'<op>'")``, so its users see why the request failed.

Operations are named by their frozen upstream legacy integer id or by their snake_case
name; ops without a legacy id travel as strings.  ``DeviceIPCWrapper`` objects travel as
msgpack Ext code 1 (see :mod:`lmcache.v1.platform.base.ipc_wrapper`).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Annotated, Any

import msgspec
import torch
from msgspec import Meta

from lmcache.v1.multiprocess.wire.custom_types import (
    MAX_KV_EVENTS_PER_BATCH,
    MAX_LAYERS,
    MAX_OBJECTS,
    MAX_RECORDS,
    MAX_TOKENS,
    MAX_WORLD_SIZE,
    BlockAllocationRecord,
    BlockIds,
    Handle,
    InstanceId,
    Int64,
    IPCCacheServerKey,
    KVEventBatch,
    Name,
    ObjectNames,
    ObjectScope,
    PrefetchProgress,
    PrepareRetrieveResponse,
    PrepareStoreResponse,
    RegisterEngineDrivenContextPayload,
    RegisterEngineDrivenContextResponse,
    ServerStats,
    Timeout,
    TokenCount,
    WorldSize,
)
from lmcache.v1.platform.base.ipc_wire import DEVICE_IPC_WRAPPER_EXT_CODE
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper

PROTOCOL_VERSION = 1
ERROR_OPERATION = "__error__"

# -- request size: what a request legally carries (docs/operations.md, "Request memory") ----
_MIB = 1024**2
# A worker's inline store sends its chunks in groups of at least this many bytes (whole
# chunks, so a group is under this plus one chunk), one ``commit_store_frames`` each.
INLINE_GROUP_BYTES = 4 * _MIB
# The largest chunk the default request limit admits: 256 tokens (the default
# --chunk-size) of 512 KiB per token and rank, e.g. Llama-3.1-405B in bf16 on one rank
# (126 layers x 2 x 8 KV heads x 128 x 2 bytes = 504 KiB).  Larger chunks need a larger
# --max-message-mb.
LARGEST_DEFAULT_CHUNK_BYTES = 256 * 512 * 1024
# An ``IPCCacheServerKey``: at most MAX_TOKENS token ids of 9 msgpack bytes each (int64)
# plus its array header; every other field and payload of a store fits the slack below.
MAX_KEY_TOKEN_BYTES = 9 * MAX_TOKENS + 5
_OTHER_PAYLOAD_BYTES = 64 * 1024
# The largest legal request: one inline store group with its key, rounded up to whole MiB
# (169 MiB).  Nothing a worker sends is larger unless its chunks are.
_LARGEST_REQUEST_BYTES = (
    INLINE_GROUP_BYTES + LARGEST_DEFAULT_CHUNK_BYTES + MAX_KEY_TOKEN_BYTES + _OTHER_PAYLOAD_BYTES
)
DEFAULT_MAX_MESSAGE_BYTES = -(-_LARGEST_REQUEST_BYTES // _MIB) * _MIB
# Bytes of requests received and not yet answered, across all peers: a request past it gets
# ``busy`` at once.  Six largest requests: a few workers' pipelined stores in flight.
DEFAULT_MAX_INFLIGHT_BYTES = 1024 * _MIB
# Requests up to this size (lookups, pings, prepares: control traffic) are never refused
# ``busy``; the transport's cap on requests in flight bounds them (1024 x 64 KiB).
BUDGET_EXEMPT_BYTES = 64 * 1024

# Frozen upstream ``RequestType`` values; 11 (query_prefetch_lookup_hits) is retired.
LEGACY_OPERATION_IDS: dict[str, int] = {
    "register_kv_cache": 1,
    "unregister_kv_cache": 2,
    "register_q_cache": 3,
    "unregister_q_cache": 4,
    "store_q": 5,
    "store": 6,
    "retrieve": 7,
    "lookup": 8,
    "query_prefetch_status": 9,
    "wait_prefetch_status": 10,
    "free_lookup_locks": 12,
    "end_session": 13,
    "register_kv_cache_engine_driven_context": 14,
    "unregister_kv_cache_engine_driven_context": 15,
    "prepare_store": 16,
    "commit_store": 17,
    "prepare_retrieve": 18,
    "commit_retrieve": 19,
    "clear": 20,
    "get_chunk_size": 21,
    "ping": 22,
    "report_block_allocation": 23,
    "noop": 24,
    "cb_register_rope": 25,
    "cb_unregister_rope": 26,
    "cb_retrieve_pre_computed": 27,
    "cb_unified_lookup": 28,
    "p2p_lookup_and_lock": 29,
    "p2p_query_lookup_results": 30,
    "p2p_unlock_objects": 31,
    "get_experimental": 32,
    "cb_protocol_handshake": 33,
}
_OPERATIONS_BY_ID = {v: k for k, v in LEGACY_OPERATION_IDS.items()}


class ErrorCode(str, enum.Enum):
    MALFORMED_FRAME = "malformed_frame"
    UNKNOWN_OPERATION = "unknown_operation"
    VERSION_MISMATCH = "version_mismatch"
    BAD_PAYLOAD = "bad_payload"
    MESSAGE_TOO_LARGE = "message_too_large"
    UNKNOWN_WORKER = "unknown_worker"
    UNSUPPORTED_TRANSFER_MODE = "unsupported_transfer_mode"
    SHAPE_MISMATCH = "shape_mismatch"
    NOT_FOUND = "not_found"
    OUT_OF_MEMORY = "out_of_memory"
    SHUTTING_DOWN = "shutting_down"
    FORBIDDEN = "forbidden"
    UNAUTHORIZED = "unauthorized"
    # Over the server's in-flight byte budget (--max-inflight-mb): nothing was done;
    # the same request may succeed once earlier ones are answered.
    BUSY = "busy"
    INTERNAL = "internal"


# Codes after which the very same request may succeed when sent again later.
RETRYABLE_ERROR_CODES = frozenset({ErrorCode.BUSY.value})


class ErrorReply(msgspec.Struct, forbid_unknown_fields=True):
    """The payload of every failure reply."""

    code: str
    message: str
    operation: str = ""


class ProtocolError(Exception):
    """A request the server answers with an :class:`ErrorReply` (raised inside handlers)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Pool(str, enum.Enum):
    """Where the server runs an operation's handler."""

    # One single-thread executor per client identity: that client's requests run in order
    # (registration, store/retrieve and the prepare/commit pairs depend on it).
    AFFINITY = "affinity"
    # Any thread of a shared pool: lookups and management that may block on storage.
    SHARED = "shared"
    # The transport's own thread: cheap answers that never block.
    INLINE = "inline"


class Access(str, enum.Enum):
    """What an operation may touch: declared per operation, so that adding one means
    deciding which (the admin gate and its tests read it)."""

    # Acts for the calling worker or request only: its registration, liveness, lookups,
    # sessions, and the chunks it stores or retrieves under its own keys.
    CALLER = "caller"
    # Reads server-wide facts (chunk size, counters, announced chunk hashes); changes
    # nothing.
    READ = "read"
    # Acts on every worker's data or on server-wide state: refused unless the server runs
    # with --enable-admin-ops; the last payload is the optional admin token.
    ADMIN = "admin"


@dataclasses.dataclass(frozen=True)
class RpcSpec:
    """One operation: payload names and types in order, how many are required, the response,
    the server method that handles it and the pool that runs it.

    Payload types carry their bounds (msgspec ``Meta`` constraints, see
    :mod:`~lmcache.v1.multiprocess.wire.custom_types`), so decoding is validation.
    ``access`` (required, see :class:`Access`) says what the operation may touch;
    ``ADMIN`` operations are refused unless the server runs with ``--enable-admin-ops``,
    and their last payload is the optional admin token (see
    :mod:`lmcache.v1.multiprocess.wire.security`).
    ``handler`` names the ``MPCacheServer`` method called with the decoded payloads (the
    operation's own name unless given); the transport binds it once at start-up.
    """

    operation: str
    payloads: tuple[tuple[str, Any], ...]
    response_type: Any
    required: int | None = None
    pool: Pool = Pool.INLINE
    handler: str = ""
    # Raw chunk frames after the payloads (the framed inline sub-path): at most this many
    # in a request, never msgpack-decoded; the handler gets them, as memoryviews, as its
    # last argument.  Their total size is bounded by --max-message-mb like every request.
    bulk_frames: int = 0
    # The handler returns a :class:`BulkReply`: its frames follow the response frame.
    bulk_reply: bool = False
    # Keyword-only and without a default: every operation states it.
    access: Access = dataclasses.field(kw_only=True)

    def __post_init__(self) -> None:
        if not self.handler:
            object.__setattr__(self, "handler", self.operation)
        if self.bulk_frames and self.min_payloads != len(self.payloads):
            # Bulk frames start where the payloads end: every payload must be present.
            raise ValueError(f"{self.operation}: bulk frames need every payload required")

    @property
    def admin(self) -> bool:
        return self.access is Access.ADMIN

    @property
    def payload_types(self) -> tuple[Any, ...]:
        return tuple(kind for _name, kind in self.payloads)

    @property
    def payload_names(self) -> tuple[str, ...]:
        return tuple(name for name, _kind in self.payloads)

    @property
    def min_payloads(self) -> int:
        return len(self.payloads) if self.required is None else self.required


_KEY = ("key", IPCCacheServerKey)
_INSTANCE = ("instance_id", InstanceId)
# ``lookup``'s ``tp_size``: the ranks whose chunks must all be present (0 is read as 1).
_TP_SIZE = ("tp_size", Annotated[int, Meta(ge=0, le=MAX_WORLD_SIZE)])
_REQUEST_ID = ("request_id", Name)
KVCacheWrappers = Annotated[list[DeviceIPCWrapper], Meta(min_length=1, max_length=MAX_LAYERS)]
# Chunks of one framed request (one data frame each): 1M tokens at 256-token chunks, far
# beyond any context; a longer request is refused with message_too_large.
MAX_BULK_FRAMES = 4096
ChunkIndices = Annotated[
    list[Annotated[int, Meta(ge=0, lt=MAX_BULK_FRAMES)]], Meta(max_length=MAX_BULK_FRAMES)
]
# The admin token is ours (upstream never sends it); long enough for any sane secret.
ADMIN_TOKEN_TYPE = Annotated[str, Meta(max_length=4096)] | None

RPC_SPECS: dict[str, RpcSpec] = {
    spec.operation: spec
    for spec in (
        RpcSpec(
            "register_kv_cache",
            (
                _INSTANCE,
                ("kv_cache", KVCacheWrappers),
                ("model_name", Name),
                ("world_size", WorldSize),
                ("engine_type", Any),
                ("layout_hints", Any),
                ("engine_group_infos", Any),
            ),
            None,
            required=4,
            pool=Pool.AFFINITY,
            access=Access.CALLER,
        ),
        RpcSpec(
            "unregister_kv_cache", (_INSTANCE,), None, pool=Pool.AFFINITY, access=Access.CALLER
        ),
        RpcSpec(
            "store",
            (_KEY, _INSTANCE, ("block_ids", BlockIds), ("event_handle", Handle)),
            tuple[bytes, bool],
            pool=Pool.AFFINITY,
            access=Access.CALLER,
        ),
        RpcSpec(
            "retrieve",
            (
                _KEY,
                _INSTANCE,
                ("block_ids", BlockIds),
                ("event_handle", Handle),
                ("skip_first_n_tokens", TokenCount),
            ),
            tuple[bytes, bool],
            required=4,
            pool=Pool.AFFINITY,
            access=Access.CALLER,
        ),
        RpcSpec("lookup", (_KEY, _TP_SIZE), None, pool=Pool.SHARED, access=Access.CALLER),
        RpcSpec(
            "query_prefetch_status",
            (_REQUEST_ID,),
            int | None,
            pool=Pool.SHARED,
            access=Access.CALLER,
        ),
        RpcSpec(
            "wait_prefetch_status",
            (_REQUEST_ID, ("timeout", Timeout)),
            int | None,
            pool=Pool.SHARED,
            access=Access.CALLER,
        ),
        RpcSpec(
            "free_lookup_locks", (_KEY, _TP_SIZE), None, pool=Pool.SHARED, access=Access.CALLER
        ),
        RpcSpec("end_session", (_REQUEST_ID,), None, pool=Pool.SHARED, access=Access.CALLER),
        RpcSpec(
            "register_kv_cache_engine_driven_context",
            (("payload", RegisterEngineDrivenContextPayload),),
            RegisterEngineDrivenContextResponse,
            pool=Pool.AFFINITY,
            access=Access.CALLER,
        ),
        RpcSpec(
            "unregister_kv_cache_engine_driven_context",
            (_INSTANCE,),
            None,
            pool=Pool.AFFINITY,
            access=Access.CALLER,
        ),
        RpcSpec(
            "prepare_store",
            (_KEY, _INSTANCE),
            PrepareStoreResponse,
            pool=Pool.AFFINITY,
            access=Access.CALLER,
        ),
        # ``data`` is bounded by the request size limit (--max-message-mb).
        RpcSpec(
            "commit_store",
            (_KEY, _INSTANCE, ("data", bytes)),
            bool,
            required=2,
            pool=Pool.AFFINITY,
            access=Access.CALLER,
        ),
        RpcSpec(
            "prepare_retrieve",
            (_KEY, _INSTANCE),
            PrepareRetrieveResponse,
            pool=Pool.AFFINITY,
            access=Access.CALLER,
        ),
        RpcSpec(
            "commit_retrieve", (_KEY, _INSTANCE), bool, pool=Pool.AFFINITY, access=Access.CALLER
        ),
        # Upstream sends at most ``force``; the trailing admin token is ours (optional).
        RpcSpec(
            "clear",
            (("force", bool), ("admin_token", ADMIN_TOKEN_TYPE)),
            None,
            required=0,
            access=Access.ADMIN,
            pool=Pool.SHARED,
        ),
        RpcSpec("get_chunk_size", (), int, access=Access.READ),
        RpcSpec(
            "ping",
            (("instance_id", InstanceId | None),),
            bool,
            required=0,
            pool=Pool.SHARED,
            access=Access.CALLER,
        ),
        RpcSpec(
            "report_block_allocation",
            (
                _INSTANCE,
                ("model_name", Name),
                (
                    "records",
                    Annotated[list[BlockAllocationRecord], Meta(max_length=MAX_RECORDS)],
                ),
            ),
            None,
            access=Access.CALLER,
        ),
        RpcSpec("noop", (), str, access=Access.READ),
        RpcSpec("get_experimental", (), list[str], access=Access.READ),
        # Additions (string ops on the wire): version handshake and counters.
        RpcSpec(
            "protocol_handshake",
            (("client_version", Int64),),
            tuple[int, bool],
            access=Access.CALLER,
        ),
        RpcSpec(
            "set_engine_driven_sub_path",
            (_INSTANCE, ("sub_path", Annotated[str, Meta(max_length=64)])),
            bool,
            pool=Pool.AFFINITY,
            access=Access.CALLER,
        ),
        RpcSpec("get_stats", (), ServerStats, pool=Pool.SHARED, access=Access.READ),
        # The framed inline sub-path: chunk bytes as their own frames, never msgpack.
        RpcSpec(
            "commit_store_frames",
            (_KEY, _INSTANCE, ("chunk_indices", ChunkIndices)),
            bool,
            pool=Pool.AFFINITY,
            bulk_frames=MAX_BULK_FRAMES,
            access=Access.CALLER,
        ),
        RpcSpec(
            "retrieve_frames",
            (_KEY, _INSTANCE),
            PrepareRetrieveResponse,
            pool=Pool.AFFINITY,
            bulk_reply=True,
            access=Access.CALLER,
        ),
        # Upstream streams batches (MessagingStream); ours answers one batch per call
        # without waiting, and the subscriber polls again from ``next_cursor``.
        RpcSpec(
            "subscribe_kv_events",
            (
                _INSTANCE,
                ("model_name", Name),
                ("cursor", Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]),
                ("max_events", Annotated[int, Meta(ge=1, le=MAX_KV_EVENTS_PER_BATCH)]),
            ),
            KVEventBatch,
            access=Access.READ,
        ),
        # Named objects (an engine's pages keyed by its own hashes, e.g. SGLang HiCache):
        # opaque bytes under a client-chosen name in an ObjectScope, not token chunks.
        # ``put_objects`` takes one data frame per name and answers, per name, whether it
        # is stored; ``get_objects`` answers, per name, whether it was found, followed by
        # one frame per found object; ``count_object_prefix`` answers how many leading
        # names are stored.
        RpcSpec(
            "put_objects",
            (("scope", ObjectScope), ("names", ObjectNames)),
            list[bool],
            pool=Pool.SHARED,
            bulk_frames=MAX_OBJECTS,
            access=Access.CALLER,
        ),
        RpcSpec(
            "get_objects",
            (("scope", ObjectScope), ("names", ObjectNames)),
            list[bool],
            pool=Pool.SHARED,
            bulk_reply=True,
            access=Access.CALLER,
        ),
        RpcSpec(
            "count_object_prefix",
            (("scope", ObjectScope), ("names", ObjectNames)),
            int,
            pool=Pool.SHARED,
            access=Access.CALLER,
        ),
        RpcSpec(
            "query_prefetch_progress",
            (_REQUEST_ID,),
            PrefetchProgress | None,
            pool=Pool.SHARED,
            access=Access.CALLER,
        ),
    )
}
# The most payloads any operation takes: beyond it (and its data frames) a request is
# refused as too large, any fewer extra as a version mismatch.
MAX_PAYLOAD_FRAMES = max(len(spec.payloads) for spec in RPC_SPECS.values())
# uid + operation + the most payload and data frames any operation takes; more frames are
# refused unread (each operation's own bound is checked once its name is decoded).
MAX_REQUEST_FRAMES = 2 + max(len(spec.payloads) + spec.bulk_frames for spec in RPC_SPECS.values())


ADMIN_OPERATIONS = frozenset(name for name, spec in RPC_SPECS.items() if spec.admin)


# -- msgspec hooks ---------------------------------------------------------------------------


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, DeviceIPCWrapper):
        return msgspec.msgpack.Ext(DEVICE_IPC_WRAPPER_EXT_CODE, DeviceIPCWrapper.Serialize(obj))
    if isinstance(obj, torch.dtype):
        return str(obj).removeprefix("torch.")
    if isinstance(obj, torch.Size):
        return list(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    raise NotImplementedError(f"cannot put {type(obj).__qualname__} on the MP wire")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code != DEVICE_IPC_WRAPPER_EXT_CODE:
        raise ValueError(f"unknown msgpack extension code {code}")
    return DeviceIPCWrapper.Deserialize(bytes(data))


def _dec_hook(expected: type, obj: Any) -> Any:
    # TypeError (not NotImplementedError): msgspec turns it into a ValidationError that
    # names the path of the bad value, e.g. a plain int where a wrapper belongs.
    if expected is DeviceIPCWrapper and isinstance(obj, DeviceIPCWrapper):
        return obj
    if expected is torch.dtype and isinstance(obj, str):
        dtype = getattr(torch, obj, None)
        if isinstance(dtype, torch.dtype):
            return dtype
    raise TypeError(f"expected {_type_name(expected)}, got {type(obj).__name__}")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODERS: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def encode(obj: Any) -> bytes:
    return _ENCODER.encode(obj)


def _decoder(expected: Any) -> msgspec.msgpack.Decoder[Any]:
    decoder = _DECODERS.get(expected)
    if decoder is None:
        decoder = msgspec.msgpack.Decoder(expected, ext_hook=_ext_hook, dec_hook=_dec_hook)
        _DECODERS[expected] = decoder
    return decoder


def decode(data: bytes | memoryview, expected: Any = Any) -> Any:
    return _decoder(expected).decode(data)


def wire_encoder() -> msgspec.msgpack.Encoder:
    """The MP wire's msgpack encoder (its hooks: IPC wrappers as Ext 1, dtypes, sizes)."""
    return _ENCODER


def wire_decoder(expected: Any = Any) -> msgspec.msgpack.Decoder[Any]:
    """A msgpack decoder for ``expected`` with the MP wire's hooks (cached per type)."""
    return _decoder(expected)


# -- operations ------------------------------------------------------------------------------


def encode_operation(operation: str) -> bytes:
    legacy = LEGACY_OPERATION_IDS.get(operation)
    return encode(legacy if legacy is not None else operation)


def decode_operation(frame: bytes | memoryview) -> str:
    """The snake_case name of the operation frame; raises ``ProtocolError``."""
    try:
        raw = decode(frame, int | str)
    except Exception as exc:  # any byte string must end as a typed error, never a crash
        raise ProtocolError(
            ErrorCode.MALFORMED_FRAME, f"operation frame is not a msgpack int or str ({exc})"
        ) from None
    name = _OPERATIONS_BY_ID.get(raw) if isinstance(raw, int) else raw
    if name is None or name not in RPC_SPECS:
        raise ProtocolError(
            ErrorCode.UNKNOWN_OPERATION,
            f"unknown or unsupported operation {raw!r}; supported: {sorted(RPC_SPECS)}",
        )
    return name


def decode_payloads(spec: RpcSpec, frames: Sequence[bytes | memoryview]) -> list[Any]:
    """Typed, bounds-checked payloads of ``spec``; anything else raises ``ProtocolError``.

    No other exception escapes: whatever the frames hold (bad msgpack, wrong types,
    out-of-range numbers, garbage or unknown extension types, nesting deeper than the
    decoder's recursion limit) ends as ``bad_payload`` naming the payload.
    """
    if not spec.min_payloads <= len(frames) <= len(spec.payloads):
        raise ProtocolError(
            ErrorCode.VERSION_MISMATCH,
            f"{spec.operation} takes {spec.min_payloads}..{len(spec.payloads)} payload "
            f"frames, got {len(frames)}: probably a version mismatch between the lmcache "
            f"client and lmcache server",
        )
    payloads = []
    for index, (frame, (name, expected)) in enumerate(zip(frames, spec.payloads)):
        try:
            payloads.append(decode(frame, expected))
        except Exception as exc:
            payloads.clear()
            raise ProtocolError(
                ErrorCode.BAD_PAYLOAD,
                f"{spec.operation}: payload {index} ({name}) is not a valid "
                f"{_type_name(expected)}: {_first_line(exc)}",
            ) from None
    return payloads


@dataclasses.dataclass
class BulkReply:
    """A handler's response plus raw frames sent after it, zero-copy (``bulk_reply``).

    Each frame is any buffer; the transport keeps a reference to it until ZeroMQ has sent
    it, so a buffer whose owner is released on garbage collection stays valid in flight.
    """

    response: Any
    frames: list[Any]


def split_bulk(spec: RpcSpec, frames: Sequence[Any]) -> tuple[Sequence[Any], Sequence[Any]]:
    """(payload frames, bulk frames) of a request's frames after uid and operation;
    raises ``message_too_large`` when they break the operation's frame bound (more
    payloads than any operation takes, or more data frames than it allows)."""
    if not spec.bulk_frames:
        if len(frames) > MAX_PAYLOAD_FRAMES:
            raise ProtocolError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"request of {len(frames) + 2} frames exceeds the limit of "
                f"{MAX_PAYLOAD_FRAMES + 2} frames of {spec.operation} (uid, operation and "
                f"at most {MAX_PAYLOAD_FRAMES} payloads)",
            )
        return frames, ()
    count = len(spec.payloads)
    if len(frames) < count:
        return frames, ()  # decode_payloads names the missing payloads
    bulk = frames[count:]
    if len(bulk) > spec.bulk_frames:
        raise ProtocolError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"{spec.operation} takes at most {spec.bulk_frames} data frames, got {len(bulk)}",
        )
    return frames[:count], bulk


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    line = text.splitlines()[0] if text.strip() else type(exc).__name__
    return line if len(line) <= 300 else line[:300] + "..."


def _type_name(expected: Any) -> str:
    if getattr(expected, "__metadata__", None) is not None:  # Annotated[T, Meta(...)]
        expected = expected.__origin__
    return getattr(expected, "__name__", None) or str(expected)


def encode_request(uid: int, operation: str, payloads: Sequence[Any]) -> list[bytes]:
    spec = RPC_SPECS.get(operation)
    if spec is not None and not spec.min_payloads <= len(payloads) <= len(spec.payloads):
        raise ValueError(f"{operation} takes {len(spec.payloads)} payloads")
    return [encode(uid), encode_operation(operation), *(encode(p) for p in payloads)]


def encode_success(uid_frame: bytes, op_frame: bytes, response: Any) -> list[Any]:
    if isinstance(response, BulkReply):
        return [uid_frame, op_frame, encode(response.response), *response.frames]
    if response is None:
        return [uid_frame, op_frame]
    return [uid_frame, op_frame, encode(response)]


def error_operation_frame(code: ErrorCode, message: str) -> str:
    """The op frame of a failure: readable on its own by clients that ignore payloads."""
    return f"{ERROR_OPERATION} {code.value}: {message}"


def is_error_operation(op: object) -> bool:
    return isinstance(op, str) and op.startswith(ERROR_OPERATION)


def encode_error(uid_frame: bytes, code: ErrorCode, message: str, operation: str) -> list[bytes]:
    reply = ErrorReply(code=code.value, message=message, operation=operation)
    return [uid_frame, encode(error_operation_frame(code, message)), encode(reply)]
