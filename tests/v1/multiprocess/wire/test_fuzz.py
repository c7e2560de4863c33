"""Fuzz the MP wire: no message kills, wedges or leaks the server, every one gets one reply.

The messages come from ``protocol.RPC_SPECS`` (see ``wire_fuzz.py``) with a fresh seed each
run, printed so a failure can be replayed: ``LMCACHE_FUZZ_SEED=<seed>``.
``LMCACHE_FUZZ_MESSAGES`` sets the count (default 20,000).
"""

from __future__ import annotations

import collections
import os
import random
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import torch
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from mp_server_helpers import CHUNK_SIZE, ServerProcess, make_kv, unlink_kv
from wire_fuzz import (
    NASTY_INTS,
    FuzzResult,
    FuzzSession,
    MessageFactory,
    ValueFactory,
    rss_bytes,
    semantic_seeds,
    shm_bytes,
    shm_segments,
    wrapper_exts,
)
from wire_fuzz import request_key as _key

from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

MAX_MESSAGE_MB = 1
WARMUP_MESSAGES = 2000
# Allowed growth between the end of warm-up and the end of the run: allocator caches and
# the bounded lookup-session table may grow; a per-message leak of even 1 KiB over 18,000
# messages would not fit together with them.
RSS_GROWTH_LIMIT = 48 * 1024**2


def _fuzz_seed() -> int:
    raw = os.environ.get("LMCACHE_FUZZ_SEED")
    return int(raw) if raw else secrets.randbits(63)


def _fuzz_messages() -> int:
    return int(os.environ.get("LMCACHE_FUZZ_MESSAGES", "20000"))


@pytest.fixture(scope="module")
def fuzz_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """Its own server (so RSS and mappings are the fuzz's alone), short reap timeouts."""
    return server_factory(
        "--supported-transfer-mode",
        "auto",
        "--max-message-mb",
        str(MAX_MESSAGE_MB),
        "--worker-reap-timeout-seconds",
        "2",
        "--pending-transfer-timeout-seconds",
        "1",
    )


def _describe(seed: int, result: FuzzResult, factory: MessageFactory) -> str:
    return (
        f"fuzz seed {seed} (replay: LMCACHE_FUZZ_SEED={seed}): sent {result.sent}, "
        f"replied {result.replied}, missing {result.missing}, unexpected {result.unexpected}, "
        f"bad replies {result.bad_replies}, slowest window {result.slowest_reply_s:.2f}s, "
        f"{result.elapsed_s:.1f}s; codes {dict(result.codes)}; "
        f"strategies {dict(factory.strategy_counts)}"
    )


def test_fuzz_every_message_gets_one_reply(fuzz_server: ServerProcess) -> None:
    _fuzz(fuzz_server, _fuzz_messages())


@pytest.fixture(scope="module")
def keyed_fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """As ``fuzz_server``, with CURVE keys: the fuzz runs behind the handshake."""
    from mp_server_helpers import BASE_ARGS

    from lmcache.v1.multiprocess.wire.curve import CurveClientKeys, write_key_pair

    root = tmp_path_factory.mktemp("fuzz-keys")
    server_public, server_secret = write_key_pair(root / "server", "server")
    _public, client_secret = write_key_pair(root / "authorized", "fuzzer")
    server = ServerProcess(
        [
            *BASE_ARGS,
            "--supported-transfer-mode", "auto",
            "--max-message-mb", str(MAX_MESSAGE_MB),
            "--worker-reap-timeout-seconds", "2",
            "--pending-transfer-timeout-seconds", "1",
            "--curve-secret-key-file", str(server_secret),
            "--authorized-keys", str(root / "authorized"),
        ],
        root / "server.log",
        curve=CurveClientKeys.from_files(client_secret, server_public),
    )  # fmt: skip
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_fuzz_with_curve_keys_every_message_gets_one_reply(
    keyed_fuzz_server: ServerProcess,
) -> None:
    """The same fuzz through an authenticated, encrypted connection (a quarter of the
    messages: the framing and handlers are the same, the transport is not)."""
    _fuzz(keyed_fuzz_server, max(WARMUP_MESSAGES + 1000, _fuzz_messages() // 4))


def _fuzz(fuzz_server: ServerProcess, total: int) -> None:
    seed = _fuzz_seed()
    print(f"\nfuzz seed {seed}, {total} messages (replay: LMCACHE_FUZZ_SEED={seed})")
    rng = random.Random(seed)
    fuzz_kv = make_kv(shm=True, seed=3)
    factory = MessageFactory(
        rng,
        MAX_MESSAGE_MB * 1024**2,
        semantic_seeds(wrapper_exts(fuzz_kv), CHUNK_SIZE),
        wrapper_exts(fuzz_kv),
    )
    uids = iter(range(1 << 62))
    messages = (factory.message(next(uids)) for _ in iter(int, 1))
    pid = fuzz_server.proc.pid
    session = FuzzSession(fuzz_server.url, curve=fuzz_server.curve)
    try:
        warm = session.run(messages, min(WARMUP_MESSAGES, total))
        rss_before, shm_before = rss_bytes(pid), shm_segments(pid)
        rest = session.run(messages, max(0, total - WARMUP_MESSAGES))
        rss_after, shm_after = rss_bytes(pid), shm_segments(pid)
    finally:
        session.close()
        unlink_kv(fuzz_kv)
    result = FuzzResult(
        sent=warm.sent + rest.sent,
        replied=warm.replied + rest.replied,
        missing=warm.missing + rest.missing,
        unexpected=warm.unexpected + rest.unexpected,
        bad_replies=warm.bad_replies + rest.bad_replies,
        slowest_reply_s=max(warm.slowest_reply_s, rest.slowest_reply_s),
        codes=warm.codes + rest.codes,
        elapsed_s=warm.elapsed_s + rest.elapsed_s,
    )
    summary = _describe(seed, result, factory)
    print(summary)
    print(f"server RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB")
    assert fuzz_server.proc.poll() is None, f"server died: {summary}\n{fuzz_server.log()}"
    assert result.sent == total
    assert result.replied == total, summary
    assert result.missing == 0 and result.unexpected == 0, summary
    assert result.bad_replies == 0, summary
    assert result.codes["internal"] == 0, f"{summary}\n{fuzz_server.log()[-5000:]}"
    assert set(factory.op_counts) == set(protocol.RPC_SPECS), "an operation was never fuzzed"
    assert rss_after - rss_before < RSS_GROWTH_LIMIT, (
        f"server RSS grew {(rss_after - rss_before) / 2**20:.1f} MiB: {summary}"
    )
    # Registered KV caches are released when their worker is unregistered or reaped; what
    # stays mapped must not grow past the server's own segments and the one fuzzed cache.
    grown = shm_after - shm_before
    assert shm_bytes(grown) <= shm_bytes(shm_segments_of_cache(fuzz_kv)), (
        f"server maps new /dev/shm segments {sorted(grown)}: {summary}"
    )
    _assert_store_retrieve_bit_exact(fuzz_server)


def shm_segments_of_cache(kv: list[torch.Tensor]) -> set[str]:
    from lmcache.v1.platform.cpu.shm import shm_segment_of

    return {f"/dev/shm/{name.lstrip('/')}" for t in kv if (name := shm_segment_of(t))}


def _assert_store_retrieve_bit_exact(server: ServerProcess) -> None:
    keys = {"curve": server.curve}
    for mode in ("engine_driven", "lmcache_driven"):
        shm = mode == "lmcache_driven"
        kv, out = make_kv(shm=shm, seed=8), make_kv(shm=shm, seed=None)
        writer = KVCacheWorker(
            kv, model_name=f"after-fuzz-{mode}", server_url=server.url, mode=mode, **keys
        )
        reader = KVCacheWorker(
            out, model_name=f"after-fuzz-{mode}", server_url=server.url, mode=mode, **keys
        )
        try:
            tokens = list(range(2 * CHUNK_SIZE))
            assert writer.store(tokens, list(range(8)))
            assert reader.retrieve(tokens, list(range(8, 16)))
            for a, b in zip(kv, out):
                assert torch.equal(a[:, :8], b[:, 8:16]), f"{mode}: bytes differ after the fuzz"
        finally:
            writer.close()
            reader.close()
            if shm:
                unlink_kv(kv)
                unlink_kv(out)


# -- in-process: decode_payloads --------------------------------------------------------------

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.builds(
        msgspec.msgpack.Ext,
        st.integers(min_value=-128, max_value=127),
        st.binary(max_size=40),
    )
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_FRAMES = st.lists(
    st.one_of(
        _VALUES.map(msgspec.msgpack.encode),
        st.binary(max_size=64),
        st.integers(min_value=1, max_value=20000).map(lambda d: b"\x91" * d + b"\x01"),
    ),
    max_size=9,
)


@settings(max_examples=400, deadline=None)
@given(operation=st.sampled_from(sorted(protocol.RPC_SPECS)), frames=_FRAMES)
def test_decode_payloads_of_random_frames(operation: str, frames: list[bytes]) -> None:
    spec = protocol.RPC_SPECS[operation]
    try:
        payloads = protocol.decode_payloads(spec, frames)
    except protocol.ProtocolError as exc:
        assert exc.code in (protocol.ErrorCode.BAD_PAYLOAD, protocol.ErrorCode.VERSION_MISMATCH)
        return
    assert isinstance(payloads, list) and len(payloads) == len(frames)


@pytest.mark.parametrize("operation", sorted(protocol.RPC_SPECS))
@settings(max_examples=60, deadline=None)
@given(
    rnd=st.randoms(use_true_random=False),
    nasty=_VALUES,
    position=st.integers(min_value=0, max_value=8),
    mode=st.sampled_from(["payload", "element", "raw", "deep", "drop", "extra"]),
)
def test_decode_payloads_of_mutated_valid_requests(
    operation: str, rnd: random.Random, nasty: Any, position: int, mode: str
) -> None:
    """Valid payloads of the operation's own types with one part replaced: what reaches
    the type- and bound-checking (and the decode hooks) that random frames rarely do."""
    spec = protocol.RPC_SPECS[operation]
    values = ValueFactory(rnd, [])
    payloads = [values.valid(kind) for _name, kind in spec.payloads]
    index = position % len(payloads) if payloads else 0
    if mode == "element" and payloads:
        target = payloads[index]
        if isinstance(target, list) and target:
            target[position % len(target)] = nasty
        elif isinstance(target, dict) and target:
            target[sorted(target)[position % len(target)]] = nasty
        else:
            payloads[index] = nasty
    elif mode == "payload" and payloads:
        payloads[index] = nasty
    frames = [msgspec.msgpack.encode(p) for p in payloads]
    if mode == "raw" and frames:
        frames[index] = rnd.randbytes(position * 4)
    elif mode == "deep" and frames:
        frames[index] = b"\x91" * (1000 * (position + 1)) + b"\x01"
    elif mode == "drop":
        frames = frames[: max(0, len(frames) - 1 - position % 2)]
    elif mode == "extra":
        frames.append(msgspec.msgpack.encode(nasty))
    try:
        decoded = protocol.decode_payloads(spec, frames)
    except protocol.ProtocolError as exc:
        assert exc.code in (protocol.ErrorCode.BAD_PAYLOAD, protocol.ErrorCode.VERSION_MISMATCH)
        return
    assert isinstance(decoded, list) and len(decoded) == len(frames)


@settings(max_examples=200, deadline=None)
@given(frame=st.one_of(_VALUES.map(msgspec.msgpack.encode), st.binary(max_size=64)))
def test_decode_operation_returns_or_raises_protocol_error(frame: bytes) -> None:
    try:
        assert protocol.decode_operation(frame) in protocol.RPC_SPECS
    except protocol.ProtocolError as exc:
        assert exc.code in (
            protocol.ErrorCode.MALFORMED_FRAME,
            protocol.ErrorCode.UNKNOWN_OPERATION,
        )


# -- in-process: the transport's framing, on frame sets built from the tables ---------------

FRAMING_MESSAGES = 10000
FRAMING_CODES = frozenset(
    {"ok", "malformed_frame", "unknown_operation", "message_too_large", "version_mismatch",
     "bad_payload"}
)  # fmt: skip


def _piece(rng: random.Random, values: ValueFactory) -> bytes:
    """One frame of a kind a request is made of: a uid, an operation (legacy id or name,
    from the tables), a valid payload of some operation, or not msgpack at all."""
    kind = rng.randrange(6)
    if kind == 0:
        return protocol.encode(rng.choice([*NASTY_INTS, rng.randrange(1 << 62)]))
    if kind == 1:
        return protocol.encode(rng.choice(list(protocol.LEGACY_OPERATION_IDS.values())))
    if kind == 2:
        return protocol.encode(rng.choice(sorted(protocol.RPC_SPECS)))
    if kind == 3:
        spec = protocol.RPC_SPECS[rng.choice(sorted(protocol.RPC_SPECS))]
        if spec.payloads:
            return msgspec.msgpack.encode(values.valid(rng.choice(spec.payload_types)))
    if kind == 4:
        return b""
    return rng.randbytes(rng.randint(1, 24))


def _frame_set(rng: random.Random, values: ValueFactory) -> list[bytes]:
    """Frames after the identity: a request of one operation cut short, grown or with one
    frame swapped, or pieces in any order and number (none to past MAX_REQUEST_FRAMES)."""
    if rng.random() < 0.5:
        operation = rng.choice(sorted(protocol.RPC_SPECS))
        spec = protocol.RPC_SPECS[operation]
        frames = [protocol.encode(rng.randrange(1 << 62)), protocol.encode_operation(operation)]
        frames += [msgspec.msgpack.encode(values.valid(kind)) for kind in spec.payload_types]
        cut = rng.randint(0, len(frames) + 2)
        frames = frames[:cut] + [_piece(rng, values) for _ in range(cut - len(frames))]
        if frames and rng.random() < 0.3:
            frames[rng.randrange(len(frames))] = _piece(rng, values)
        return frames
    if rng.random() < 0.01:
        return [b"\x01"] * (protocol.MAX_REQUEST_FRAMES + 1)
    count = rng.choice([0, 1, 1, 2, rng.randint(0, protocol.MAX_PAYLOAD_FRAMES + 3)])
    return [_piece(rng, values) for _ in range(count)]


def test_framing_of_frame_sets_from_the_tables() -> None:
    """Whatever frames follow the identity, the transport's framing and decoding end in a
    request or a typed ``ProtocolError``, never another exception (an ``IndexError`` from
    a short frame set was once answered ``internal``)."""
    from lmcache.v1.multiprocess.server.transport import decode_request, frame_request

    seed = _fuzz_seed()
    print(f"\nframing fuzz seed {seed} (replay: LMCACHE_FUZZ_SEED={seed})")
    rng = random.Random(seed)
    values = ValueFactory(rng, [])
    codes: collections.Counter[str] = collections.Counter()
    for _ in range(FRAMING_MESSAGES):
        frames = _frame_set(rng, values)
        try:
            decode_request(frame_request([zmq.Frame(f) for f in frames], 1024**2))
        except protocol.ProtocolError as exc:
            codes[exc.code.value] += 1
            if len(frames) < 2 and len(frames) <= protocol.MAX_REQUEST_FRAMES:
                assert exc.code is protocol.ErrorCode.MALFORMED_FRAME, (seed, frames, exc)
        else:
            assert len(frames) >= 2, (seed, frames)
            codes["ok"] += 1
    print(f"framing fuzz seed {seed}: {dict(codes)}")
    assert set(codes) <= FRAMING_CODES, (seed, codes)
    assert codes["ok"] and codes["malformed_frame"] and codes["message_too_large"], (seed, codes)


def test_wrapper_list_holding_an_int_is_bad_payload() -> None:
    """The message that used to kill the server (NotImplementedError from the hook)."""
    spec = protocol.RPC_SPECS["register_kv_cache"]
    frames = [protocol.encode(v) for v in (1, [1], "m", 1)]
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.decode_payloads(spec, frames)
    assert info.value.code is protocol.ErrorCode.BAD_PAYLOAD
    assert "kv_cache" in info.value.message


# -- targeted: the inputs the issue names -----------------------------------------------------


def _exchange(url: str, frames: list[bytes], timeout_s: float = 5.0) -> list[list[bytes]]:
    """Send one request; every reply that arrives within ``timeout_s`` (then 0.3 s more)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(url)
        sock.send_multipart(frames)
        replies = []
        wait_ms = int(timeout_s * 1000)
        while sock.poll(wait_ms):
            replies.append(sock.recv_multipart())
            wait_ms = 300
        return replies
    finally:
        sock.close(0)
        ctx.term()


def _error(url: str, frames: list[bytes]) -> protocol.ErrorReply:
    replies = _exchange(url, frames)
    assert len(replies) == 1, f"expected exactly one reply, got {len(replies)}"
    assert protocol.is_error_operation(protocol.decode(replies[0][1])), replies[0]
    return protocol.decode(replies[0][2], protocol.ErrorReply)  # type: ignore[no-any-return]


def _request(uid: int, operation: str, *payloads: Any) -> list[bytes]:
    return [protocol.encode(uid), protocol.encode(operation), *map(protocol.encode, payloads)]


def test_register_with_an_int_wrapper_is_refused_and_server_lives(
    fuzz_server: ServerProcess,
) -> None:
    reply = _error(fuzz_server.url, _request(1, "register_kv_cache", 7, [1], "m", 1))
    assert reply.code == "bad_payload"
    assert "kv_cache" in reply.message
    assert fuzz_server.proc.poll() is None
    with fuzz_server.client() as client:
        assert client.noop() == "noop"


@pytest.mark.parametrize(
    ("operation", "payloads", "field"),
    [
        ("lookup", (_key(None, CHUNK_SIZE), 400000), "tp_size"),
        ("lookup", ({**_key(None, CHUNK_SIZE), "world_size": 0}, 1), "world_size"),
        ("lookup", ({**_key(None, CHUNK_SIZE), "end": 1 << 40}, 1), "end"),
        ("store", (_key(0, CHUNK_SIZE), 3, [[-1]], b""), "block_ids"),
        ("store", ({**_key(0, CHUNK_SIZE), "worker_id": 5000}, 3, [[0]], b""), "worker_id"),
        ("retrieve", (_key(0, CHUNK_SIZE), 3, [[0]], b"", -4), "skip_first_n_tokens"),
        ("wait_prefetch_status", ("r", float("nan")), "timeout"),
        ("ping", (1 << 64) - 1, "instance_id"),
        (
            "register_kv_cache_engine_driven_context",
            (
                {
                    "instance_id": 9,
                    "model_name": "m",
                    "world_size": 1,
                    "block_size": 4,
                    "num_layers": 1 << 20,
                    "hidden_dim_size": 16,
                    "dtype_str": "bfloat16",
                    "use_mla": False,
                },
            ),
            "num_layers",
        ),
    ],
)
def test_out_of_bounds_numbers_are_refused_naming_the_field(
    fuzz_server: ServerProcess, operation: str, payloads: Any, field: str
) -> None:
    payloads = payloads if isinstance(payloads, tuple) else (payloads,)
    reply = _error(fuzz_server.url, _request(2, operation, *payloads))
    assert reply.code == "bad_payload"
    assert field in reply.message


def test_total_request_size_and_frame_count_are_bounded(fuzz_server: ServerProcess) -> None:
    limit = MAX_MESSAGE_MB * 1024**2
    # Each frame is under the limit, together they are over it.
    pieces = [b"x" * (limit // 4)] * 5
    reply = _error(fuzz_server.url, [*_request(3, "noop"), *pieces])
    assert reply.code == "message_too_large"
    assert "per request" in reply.message
    many = _error(fuzz_server.url, [*_request(4, "noop"), *[b"\x01"] * 200])
    assert many.code == "message_too_large"
    assert "frames" in many.message
    with fuzz_server.client() as client:
        assert client.noop() == "noop"


def _build_engine() -> Any:
    """An in-process cache server (no SHM, 16 MiB L1, both transfer modes)."""
    from lmcache.v1.multiprocess.server import build_cache_server
    from lmcache.v1.multiprocess.server_config import MPServerConfig
    from lmcache.v1.platform.transfer_mode import MPTransferMode

    config = MPServerConfig(
        chunk_size=CHUNK_SIZE,
        l1_size_gb=1 / 64,
        shm_name="",
        supported_transfer_mode=MPTransferMode.AUTO,
        disable_metrics=True,
    )
    return build_cache_server(config)


@pytest.fixture
def engine() -> Any:
    server = _build_engine()
    yield server
    server.close()


def _engine_payload(instance_id: int, **overrides: Any) -> Any:
    from lmcache.v1.multiprocess.wire.custom_types import RegisterEngineDrivenContextPayload

    fields = {
        "instance_id": instance_id,
        "model_name": "m",
        "world_size": 1,
        "block_size": 4,
        "num_layers": 3,
        "hidden_dim_size": 16,
        "dtype_str": "bfloat16",
        "use_mla": False,
        **overrides,
    }
    return RegisterEngineDrivenContextPayload(**fields)


def test_registered_workers_are_capped(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmcache.v1.multiprocess.server import workers

    monkeypatch.setattr(workers, "MAX_REGISTERED_WORKERS", 3)
    for instance_id in range(3):
        engine.register_kv_cache_engine_driven_context(_engine_payload(instance_id))
    with pytest.raises(protocol.ProtocolError) as info:
        engine.register_kv_cache_engine_driven_context(_engine_payload(99))
    assert info.value.code is protocol.ErrorCode.OUT_OF_MEMORY
    engine.register_kv_cache_engine_driven_context(_engine_payload(1))  # re-register: room
    assert engine.get_stats().engine_driven_workers == 3


def test_pending_transfers_are_capped(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmcache.v1.multiprocess.server import pending

    monkeypatch.setattr(pending, "MAX_PENDING_TRANSFERS", 2)
    engine.register_kv_cache_engine_driven_context(_engine_payload(1))
    engine.set_engine_driven_sub_path(1, "inline")
    used_before = engine.get_stats().l1_used_bytes
    for n in (1, 2):
        key = IPCCacheServerKey.from_token_ids("m", 1, 0, range(n * CHUNK_SIZE))
        engine.prepare_store(key, 1)
    third = IPCCacheServerKey.from_token_ids("m", 1, 0, range(3 * CHUNK_SIZE))
    with pytest.raises(protocol.ProtocolError) as info:
        engine.prepare_store(third, 1)
    assert info.value.code is protocol.ErrorCode.OUT_OF_MEMORY
    assert engine.get_stats().pending_prepares == 2
    engine.reap(now=1e12)  # every pending transfer expired: all their chunks come back
    assert engine.get_stats().l1_used_bytes == used_before


def test_layout_larger_than_l1_is_refused_at_registration(engine: Any) -> None:
    with pytest.raises(protocol.ProtocolError) as info:
        engine.register_kv_cache_engine_driven_context(
            _engine_payload(5, num_layers=4096, hidden_dim_size=1 << 16)
        )
    assert info.value.code is protocol.ErrorCode.BAD_PAYLOAD
    assert "L1" in info.value.message


def test_a_flood_waits_in_the_transport_not_in_server_memory() -> None:
    """Past ``max_in_flight`` queued requests the loop stops reading; all are answered."""
    import threading

    from mp_server_helpers import free_port

    from lmcache.v1.multiprocess.server import MPServer
    from lmcache.v1.multiprocess.server_config import MPServerConfig

    release = threading.Event()
    started: list[str] = []

    def slow_end_session(request_id: str) -> None:
        started.append(request_id)
        release.wait(30)

    engine = _build_engine()
    engine.end_session = slow_end_session
    server = MPServer(MPServerConfig(port=free_port(), max_workers=2), engine)
    server.max_in_flight = 4
    loop = threading.Thread(target=server.serve_forever, daemon=True)
    loop.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(server.endpoint)
        for uid in range(40):
            sock.send_multipart(_request(uid, "end_session", f"r{uid}"))
        deadline = time.monotonic() + 10
        while len(started) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert server._in_flight == 4, "the loop must stop reading at max_in_flight"
        assert len(started) == 2  # two handler threads busy, two queued, the rest unread
        release.set()
        uids = set()
        while len(uids) < 40 and sock.poll(10000):
            uids.add(protocol.decode(sock.recv_multipart()[0]))
        assert uids == set(range(40))
    finally:
        release.set()
        server.request_stop()
        loop.join(10)
        sock.close(0)
        ctx.term()
        server.close()
