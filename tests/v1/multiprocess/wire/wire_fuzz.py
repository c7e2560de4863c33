"""A structure-aware fuzzer of the MP wire, generated from ``protocol.RPC_SPECS``.

Shared by ``test_fuzz.py`` (CI) and ``benchmarks/fuzz_soak.py`` (long soak).  Each message
is built from an operation's own payload table: a valid-looking request (values drawn
inside the declared bounds, plus a few semantic seeds that reach deep handler code), then
mutated field by field, at the msgpack level, or at the frame level (truncated, extra,
too many or oversized frames, random raw frames).  ``FuzzSession`` sends them through a
DEALER in windows and checks that every message gets exactly one reply, matched by the
request_uid frame the server echoes.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
import random
import time
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Union

import msgspec
import zmq

from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.wire.curve import CurveClientKeys
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.platform.base.ipc_wire import DEVICE_IPC_WRAPPER_EXT_CODE
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper

Ext = msgspec.msgpack.Ext
# Server rule (server.py): a uid frame longer than this is answered with uid -1.
MAX_ECHOED_UID_BYTES = 16
ERROR_CODES = frozenset(code.value for code in protocol.ErrorCode)

NASTY_INTS = [
    0,
    -1,
    1,
    2,
    -(1 << 63),
    (1 << 63) - 1,
    (1 << 64) - 1,
    1 << 31,
    (1 << 31) - 1,
    1 << 32,
    400000,
    10**18,
    -(10**9),
    1025,
    1024,
    1 << 22,
    (1 << 22) + 1,
]
NASTY_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 1e308, -1.0, 3601.0]
NASTY_STRS = ["", "x" * 5000, "\x00", "m/../../etc", "é" * 300, "@salt", "store", "__error__"]
# Keys the handlers look up inside free-form (Any) payloads such as layout_hints.
HANDLER_KEYS = ["kv_layout", "lmcache.tag.user", "lmcache.tag."]


@functools.cache
def _fields(tp: Any) -> tuple[tuple[str, Any], ...]:
    """(name, type) of a dataclass's or Struct's fields, in order."""
    hints = typing.get_type_hints(tp, include_extras=True)
    if dataclasses.is_dataclass(tp):
        return tuple((f.name, hints[f.name]) for f in dataclasses.fields(tp))
    return tuple((name, hints[name]) for name in tp.__struct_fields__)


@functools.cache
def _annotated(tp: Any) -> tuple[Any, dict[str, Any]]:
    """(bare type, merged Meta constraints) of a possibly ``Annotated`` type."""
    bounds: dict[str, Any] = {}
    while getattr(tp, "__metadata__", None) is not None:
        for meta in tp.__metadata__:
            if isinstance(meta, msgspec.Meta):
                for name in ("ge", "gt", "le", "lt", "min_length", "max_length"):
                    value = getattr(meta, name)
                    if value is not None:
                        bounds[name] = value
        tp = tp.__origin__
    return tp, bounds


# A wrapper that decodes (a well-formed CPU SHM descriptor) but names no existing segment.
_UNMAPPED_WRAPPER = Ext(
    DEVICE_IPC_WRAPPER_EXT_CODE,
    msgspec.msgpack.encode(
        {
            "type": "cpu_shm",
            "version": 1,
            "metadata": {
                "dtype": "bfloat16",
                "shape": [2, 4, 4, 2, 8],
                "stride": [256, 64, 16, 8, 1],
                "storage_offset": 0,
                "device_uuid": "",
            },
            "shm_name": "/lmcache_kv_fuzz_missing",
            "nbytes": 1024,
        }
    ),
)


class ValueFactory:
    """Values of a wire type: valid ones inside its bounds, or nasty ones."""

    def __init__(self, rng: random.Random, wrapper_exts: list[Ext]) -> None:
        self.rng = rng
        self.wrapper_exts = wrapper_exts  # real registrable KV caches (may be empty)

    # -- valid ---------------------------------------------------------------------------------

    def valid(self, tp: Any, depth: int = 0) -> Any:
        rng = self.rng
        tp, bounds = _annotated(tp)
        origin = typing.get_origin(tp)
        if tp is Any:
            return rng.choice([None, "vllm", {"kv_layout": "NHD"}, [1, "a"], 3])
        if tp is type(None):
            return None
        if tp is bool:
            return rng.random() < 0.5
        if tp is int:
            lo = bounds["ge"] if "ge" in bounds else bounds["gt"] + 1 if "gt" in bounds else 0
            hi = bounds["le"] if "le" in bounds else bounds["lt"] - 1 if "lt" in bounds else 1 << 16
            return rng.randint(lo, min(hi, lo + rng.choice([1, 4, 64, 1 << 16])))
        if tp is float:
            return rng.choice([0.0, 0.5, 1.0, 30.0])
        if tp is str:
            return rng.choice(["fuzz", "m", "r", "req-1", "inline", "shm", ""])
        if tp is bytes:
            return rng.choice([b"", b"\x01\x02", rng.randbytes(rng.randint(0, 64))])
        if tp is DeviceIPCWrapper:
            if rng.random() < 0.7:
                return rng.choice(self.wrapper_exts) if self.wrapper_exts else _UNMAPPED_WRAPPER
            return Ext(DEVICE_IPC_WRAPPER_EXT_CODE, rng.randbytes(rng.randint(0, 40)))
        if origin in (Union, types.UnionType):
            return self.valid(rng.choice(typing.get_args(tp)), depth + 1)
        if origin in (list, tuple):
            args = typing.get_args(tp)
            if origin is tuple and args and args[-1] is not Ellipsis:
                return [self.valid(a, depth + 1) for a in args]
            n = rng.randint(bounds.get("min_length", 0), min(bounds.get("max_length", 8), 8))
            return [self.valid(args[0], depth + 1) for _ in range(n)]
        if origin is dict:
            key_t, value_t = typing.get_args(tp)
            return {self.valid(key_t, depth + 1): self.valid(value_t, depth + 1) for _ in range(2)}
        if isinstance(tp, type) and (
            dataclasses.is_dataclass(tp) or issubclass(tp, msgspec.Struct)
        ):
            return {name: self.valid(kind, depth + 1) for name, kind in _fields(tp)}
        return None

    # -- nasty ---------------------------------------------------------------------------------

    def nasty(self, depth: int = 0) -> Any:
        rng = self.rng
        kind = rng.randrange(12)
        if kind == 0:
            return rng.choice(NASTY_INTS)
        if kind == 1:
            return rng.choice(NASTY_FLOATS)
        if kind == 2:
            return rng.choice(NASTY_STRS)
        if kind == 3:
            return rng.randbytes(rng.randint(0, 300))
        if kind == 4:
            return rng.choice([None, True, False])
        if kind == 5:  # extension code 1 (a wrapper) holding garbage or a wrong descriptor
            body = rng.choice(
                [
                    rng.randbytes(rng.randint(0, 64)),
                    msgspec.msgpack.encode({"type": "cpu_shm", "metadata": rng.choice(NASTY_INTS)}),
                    msgspec.msgpack.encode(
                        {
                            "type": rng.choice(["cpu_shm", "cuda", "npu", "nope"]),
                            "metadata": {
                                "dtype": rng.choice(["float16", "nope", ""]),
                                "shape": [rng.choice(NASTY_INTS)],
                                "stride": [1],
                                "storage_offset": rng.choice(NASTY_INTS),
                                "device_uuid": "",
                            },
                            "shm_name": rng.choice(["/lmcache_kv_nope", "/etc/passwd", ""]),
                            "nbytes": rng.choice(NASTY_INTS),
                        }
                    ),
                ]
            )
            return Ext(DEVICE_IPC_WRAPPER_EXT_CODE, body)
        if kind == 6:  # unknown extension codes
            return Ext(rng.choice([-128, -1, 0, 2, 5, 127]), rng.randbytes(rng.randint(0, 16)))
        if kind == 7 and depth < 3:
            return [self.nasty(depth + 1) for _ in range(rng.randint(0, 4))]
        if kind == 8 and depth < 3:
            keys = NASTY_STRS + HANDLER_KEYS
            return {rng.choice(keys): self.nasty(depth + 1) for _ in range(rng.randint(0, 3))}
        if kind == 9:  # big flat containers
            return [rng.choice(NASTY_INTS)] * rng.choice([1000, 20000])
        if kind == 10 and self.wrapper_exts:
            return rng.choice(self.wrapper_exts)
        return rng.randint(-(1 << 63), (1 << 64) - 1)


def _shallow_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


def _deep(depth: int) -> bytes:
    """A msgpack value nested ``depth`` arrays deep (past any decoder recursion limit)."""
    return b"\x91" * depth + b"\x01"


class MessageFactory:
    """Requests for every operation of ``RPC_SPECS``, valid-looking then mutated."""

    def __init__(
        self,
        rng: random.Random,
        max_message_bytes: int,
        semantic_seeds: dict[str, list[list[Any]]] | None = None,
        wrapper_exts: list[Ext] | None = None,
    ) -> None:
        self.rng = rng
        self.values = ValueFactory(rng, wrapper_exts or [])
        self.max_message_bytes = max_message_bytes
        self.seeds = semantic_seeds or {}
        self.operations = sorted(protocol.RPC_SPECS)
        self.op_counts: collections.Counter[str] = collections.Counter()
        self.strategy_counts: collections.Counter[str] = collections.Counter()

    def _payloads(self, spec: protocol.RpcSpec) -> list[Any]:
        seeds = self.seeds.get(spec.operation)
        if seeds and self.rng.random() < 0.5:
            # One level copied: mutations replace top-level fields and items only.
            return [_shallow_copy(p) for p in self.rng.choice(seeds)]
        count = self.rng.randint(spec.min_payloads, len(spec.payloads))
        return [self.values.valid(kind) for _name, kind in spec.payloads[:count]]

    def _operation_frame(self, operation: str) -> bytes:
        legacy = protocol.LEGACY_OPERATION_IDS.get(operation)
        if legacy is not None and self.rng.random() < 0.5:
            return protocol.encode(legacy)
        return protocol.encode(operation)

    def message(self, uid: int) -> list[bytes]:
        """One request (its uid frame first)."""
        rng = self.rng
        operation = rng.choice(self.operations)
        self.op_counts[operation] += 1
        spec = protocol.RPC_SPECS[operation]
        payloads = self._payloads(spec)
        strategy = rng.choices(
            ["valid", "field", "payload", "msgpack", "frames", "raw", "huge"],
            weights=[15, 35, 15, 10, 15, 9, 1],
        )[0]
        self.strategy_counts[strategy] += 1
        if strategy == "field":
            self._mutate_field(payloads)
        elif strategy == "payload" and payloads:
            payloads[rng.randrange(len(payloads))] = self.values.nasty()
        frames = [protocol.encode(uid), self._operation_frame(operation)]
        frames += [self._encode(p) for p in payloads]
        if spec.bulk_frames:  # raw data frames (the framed inline sub-path): any bytes
            frames += [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(0, 3))]
        if strategy == "msgpack":
            self._mutate_bytes(frames)
        elif strategy == "frames":
            frames = self._mutate_frames(frames)
        elif strategy == "raw":
            frames = [protocol.encode(uid)] + [
                rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(0, 6))
            ]
        elif strategy == "huge":
            frames = self._huge(frames)
        return frames

    def _encode(self, value: Any) -> bytes:
        try:
            return protocol.encode(value)
        except (TypeError, OverflowError, ValueError):
            return self.rng.randbytes(8)

    def _mutate_field(self, payloads: list[Any]) -> None:
        if not payloads:
            return
        index = self.rng.randrange(len(payloads))
        target = payloads[index]
        if isinstance(target, dict) and target:
            for _ in range(self.rng.randint(1, 2)):
                action = self.rng.random()
                name = self.rng.choice(list(target))
                if action < 0.8:
                    target[name] = self.values.nasty()
                elif action < 0.9:
                    del target[name]
                    if not target:
                        break
                else:
                    target["unexpected_field"] = self.values.nasty()
        elif isinstance(target, list) and target:
            target[self.rng.randrange(len(target))] = self.values.nasty()
        else:
            payloads[index] = self.values.nasty()

    def _mutate_bytes(self, frames: list[bytes]) -> None:
        rng = self.rng
        index = rng.randrange(1, len(frames))
        frame = bytearray(frames[index])
        action = rng.random()
        if action < 0.4 and frame:
            for _ in range(rng.randint(1, 4)):
                frame[rng.randrange(len(frame))] = rng.randrange(256)
        elif action < 0.7:
            frame = frame[: rng.randint(0, max(0, len(frame) - 1))]  # truncated
        elif action < 0.85:
            frame += rng.randbytes(rng.randint(1, 8))  # trailing garbage
        else:
            frame = bytearray(_deep(rng.choice([100, 1000, 5000, 100000])))
        frames[index] = bytes(frame)

    def _mutate_frames(self, frames: list[bytes]) -> list[bytes]:
        rng = self.rng
        action = rng.randrange(6)
        if action == 0:
            return frames[: rng.randint(1, len(frames))]  # fewer frames
        if action == 1:
            return frames + [rng.randbytes(rng.randint(0, 16)) for _ in range(rng.randint(1, 3))]
        if action == 2:  # more frames than any operation takes
            extra = protocol.MAX_REQUEST_FRAMES + rng.randint(0, 200)
            return frames + [b"\x01"] * (extra - len(frames) + 1)
        if action == 3:  # a garbage or overlong uid frame
            return [rng.choice([b"", b"\xc1", rng.randbytes(rng.randint(1, 40))]), *frames[1:]]
        if action == 4:  # another operation's frame, a retired id, or garbage
            op = rng.choice([11, 0, -1, 999, 1 << 40, "x", "", "__error__", *NASTY_STRS[:2]])
            return [frames[0], protocol.encode(op), *frames[2:]]
        if len(frames) > 3:  # payloads shuffled
            middle = frames[2:]
            rng.shuffle(middle)
            return frames[:2] + middle
        return frames

    def _huge(self, frames: list[bytes]) -> list[bytes]:
        """Over the total-size limit: one big frame or many frames (each under the cap)."""
        limit = self.max_message_bytes
        if self.rng.random() < 0.5:
            return [*frames[:2], b"\xc4" + b"x" * (limit + 64)]
        count = min(protocol.MAX_REQUEST_FRAMES, 6)
        piece = limit // (count - 2) + 64
        return frames[:2] + [b"y" * piece for _ in range(count - 2)]


def request_key(worker_id: int | None, chunk_size: int) -> dict[str, Any]:
    key = IPCCacheServerKey.from_token_ids(
        "fuzz", 1, worker_id, range(2 * chunk_size), request_id="fuzz-req"
    )
    return msgspec.to_builtins(key)  # type: ignore[no-any-return]


def semantic_seeds(wrappers: list[Ext], chunk_size: int) -> dict[str, list[list[Any]]]:
    """Requests that pass decoding and reach handler code: registrations that succeed
    (engine-driven id 1, LMCache-driven id 3 with a real KV cache), then transfers."""
    blocks = [list(range(8))]
    key, group_key = request_key(0, chunk_size), request_key(None, chunk_size)
    tagged_key = {
        **group_key,
        "cache_salt": "s",
        "request_configs": {"lmcache.tag.user": "a", "other": [1]},
    }
    engine = {
        "instance_id": 1,
        "model_name": "fuzz",
        "world_size": 1,
        "block_size": 4,
        "num_layers": 3,
        "hidden_dim_size": 16,
        "dtype_str": "bfloat16",
        "use_mla": False,
    }
    scope = {"model_name": "fuzz", "world_size": 2, "worker_id": 1, "cache_salt": "s"}
    return {
        # Named objects: the fuzzer adds 0-3 data frames, so some puts match their names.
        "put_objects": [[scope, ["a"]], [scope, ["a", "b"]], [{**scope, "shard": "x"}, ["c"]]],
        "get_objects": [[scope, ["a", "b", "zz"]], [scope, []]],
        "count_object_prefix": [[scope, ["a", "b", "c"]]],
        "register_kv_cache": [
            [3, wrappers, "fuzz", 1],
            [3, wrappers, "fuzz", 1, "vllm", {"kv_layout": "NHD"}, None],
        ],
        "register_kv_cache_engine_driven_context": [[engine]],
        "set_engine_driven_sub_path": [[1, "inline"], [1, "shm"]],
        "store": [[key, 3, blocks, b""]],
        "retrieve": [
            [key, 3, blocks, b"", 0],
            [key, 3, blocks, b"", 4],
        ],
        "lookup": [[group_key, 1], [group_key, 2], [tagged_key, 1]],
        "free_lookup_locks": [[group_key, 1]],
        "prepare_store": [[key, 1]],
        "commit_store": [[key, 1], [key, 1, b"\x82"]],
        "prepare_retrieve": [[key, 1]],
        "commit_retrieve": [[key, 1]],
        "query_prefetch_status": [["fuzz-req"]],
        "wait_prefetch_status": [["fuzz-req", 0.0]],
        "end_session": [["fuzz-req"]],
        "ping": [[1], [3]],
        "unregister_kv_cache": [[3]],
        "unregister_kv_cache_engine_driven_context": [[1]],
        "protocol_handshake": [[protocol.PROTOCOL_VERSION]],
        # From the start, from a cursor beyond the log (lost), one record at a time.
        "subscribe_kv_events": [[3, "fuzz", 0, 1024], [3, "fuzz", 1 << 40, 1], [1, "x", 0, 1]],
    }


def wrapper_exts(kv: list[Any]) -> list[Ext]:
    from lmcache.v1.platform.kv_wrap import wrap_kv_caches

    return [
        Ext(DEVICE_IPC_WRAPPER_EXT_CODE, DeviceIPCWrapper.Serialize(w)) for w in wrap_kv_caches(kv)
    ]


def expected_uid_frame(frames: list[bytes]) -> bytes:
    """The uid frame the server echoes in its reply to ``frames``."""
    if frames and len(frames[0]) <= MAX_ECHOED_UID_BYTES:
        return frames[0]
    return protocol.encode(-1)


@dataclasses.dataclass
class FuzzResult:
    sent: int = 0
    replied: int = 0
    missing: int = 0
    unexpected: int = 0
    bad_replies: int = 0
    slowest_reply_s: float = 0.0
    codes: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    elapsed_s: float = 0.0


class FuzzSession:
    """Sends fuzz messages in windows; every message must get exactly one reply."""

    def __init__(
        self,
        url: str,
        reply_timeout_s: float = 15.0,
        window: int = 200,
        curve: CurveClientKeys | None = None,
    ) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        if curve is not None:  # a server with CURVE keys: fuzz behind the handshake
            curve.apply(self.sock)
        self.sock.connect(url)
        self.reply_timeout_s = reply_timeout_s
        self.window = window

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()

    def run(
        self,
        messages: Iterator[list[bytes]],
        count: int,
        progress: Callable[[FuzzResult], None] | None = None,
    ) -> FuzzResult:
        result = FuzzResult()
        start = time.monotonic()
        remaining = count
        while remaining > 0:
            batch = min(self.window, remaining)
            outstanding: collections.Counter[bytes] = collections.Counter()
            for _ in range(batch):
                frames = next(messages)
                outstanding[expected_uid_frame(frames)] += 1
                self.sock.send_multipart(frames)
            result.sent += batch
            remaining -= batch
            self._collect(outstanding, batch, result)
            if progress is not None:
                result.elapsed_s = time.monotonic() - start
                progress(result)
        # Exactly one: nothing more may arrive after every message was answered.
        if self.sock.poll(300):
            while self.sock.poll(0):
                self.sock.recv_multipart()
                result.unexpected += 1
        result.elapsed_s = time.monotonic() - start
        return result

    def _collect(
        self, outstanding: collections.Counter[bytes], batch: int, result: FuzzResult
    ) -> None:
        pending = batch
        window_start = time.monotonic()
        while pending:
            if not self.sock.poll(int(self.reply_timeout_s * 1000)):
                result.missing += pending
                return
            reply = self.sock.recv_multipart()
            result.slowest_reply_s = max(result.slowest_reply_s, time.monotonic() - window_start)
            uid = reply[0]
            if outstanding[uid] <= 0:
                result.unexpected += 1
                continue
            outstanding[uid] -= 1
            pending -= 1
            result.replied += 1
            self._classify(reply, result)

    @staticmethod
    def _classify(reply: list[bytes], result: FuzzResult) -> None:
        try:
            op = protocol.decode(reply[1])
            if not protocol.is_error_operation(op):
                result.codes["ok"] += 1
                return
            error = protocol.decode(reply[2], protocol.ErrorReply)
        except (IndexError, msgspec.DecodeError):
            result.bad_replies += 1
            return
        if error.code not in ERROR_CODES:
            result.bad_replies += 1
        result.codes[error.code] += 1


# -- process measurements ----------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def shm_segments(pid: int) -> set[str]:
    """The /dev/shm files ``pid`` has open or mapped."""
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
            names.add(parts[5].removesuffix(" (deleted)"))
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            names.add(target.removesuffix(" (deleted)"))
    return names


def shm_bytes(names: set[str]) -> int:
    total = 0
    for name in names:
        try:
            total += os.stat(name).st_size
        except OSError:
            pass
    return total
