"""Bad input and faults against a real server: every failure is a typed reply or cleaned up."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from typing import Any

import msgspec
import pytest
import zmq
from mp_server_helpers import CHUNK_SIZE, SMALL_LAYOUT, ServerProcess, Stored, make_kv, unlink_kv

from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.worker.client import (
    MPClient,
    ServerError,
    ServerUnavailableError,
    free_url,
)
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker


class RawClient:
    """A DEALER that sends arbitrary frames and reads raw replies."""

    def __init__(self, url: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(url)

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def recv(self, timeout: float = 5.0) -> list[bytes]:
        assert self.sock.poll(int(timeout * 1000)), "no reply (request dropped?)"
        return self.sock.recv_multipart()

    def error(self, frames: list[bytes]) -> protocol.ErrorReply:
        self.send(frames)
        reply = self.recv()
        assert protocol.is_error_operation(protocol.decode(reply[1])), reply
        return protocol.decode(reply[2], protocol.ErrorReply)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def raw(fault_server: ServerProcess) -> Any:
    client = RawClient(fault_server.url)
    yield client
    client.close()


def _key(model: str = "m", worker_id: int | None = 0, n: int = CHUNK_SIZE) -> IPCCacheServerKey:
    return IPCCacheServerKey.from_token_ids(model, 1, worker_id, range(n))


def _enc(*items: Any) -> list[bytes]:
    return [protocol.encode(i) for i in items]


def test_malformed_frames_get_typed_errors(raw: RawClient) -> None:
    assert raw.error([b"only-one-frame"]).code == "malformed_frame"
    # One frame that is a valid request_uid (and a valid operation id): only the frame
    # count can refuse it, so this is what fails if that check is weakened.
    for lone in (protocol.encode(24), protocol.encode(7), b""):
        reply = raw.error([lone])
        assert reply.code == "malformed_frame", reply
        assert "got 1 frame(s)" in reply.message, reply
    assert raw.error([b"\xc1", protocol.encode(24)]).code == "malformed_frame"
    assert raw.error([protocol.encode(1), b"\xc1"]).code == "malformed_frame"
    assert raw.error([protocol.encode("not an int"), protocol.encode(24)]).code == "malformed_frame"


def test_unknown_operations(raw: RawClient) -> None:
    assert raw.error(_enc(1, 11)).code == "unknown_operation"  # retired legacy id
    assert raw.error(_enc(2, 999)).code == "unknown_operation"
    reply = raw.error(_enc(3, "definitely_not_an_op"))
    assert reply.code == "unknown_operation"
    assert "noop" in reply.message


def test_operation_by_legacy_id_and_by_name(raw: RawClient) -> None:
    for op in (24, "noop"):
        raw.send(_enc(7, op))
        uid, op_frame, body = raw.recv()
        assert protocol.decode(uid) == 7
        assert protocol.decode(op_frame) == op
        assert protocol.decode(body) == "noop"


def test_payload_count_and_type_errors(raw: RawClient) -> None:
    reply = raw.error(_enc(1, "store", _key()))
    assert reply.code == "version_mismatch"
    assert "version mismatch between the lmcache client and lmcache server" in reply.message
    reply = raw.error([*_enc(2, "store"), b"\x01", b"\x02", b"\x03", b"\x04"])
    assert reply.code == "bad_payload"
    assert raw.error([*_enc(3, "ping"), b"\xc1"]).code == "bad_payload"


def test_protocol_version_mismatch(fault_server: ServerProcess) -> None:
    client = MPClient(fault_server.url, timeout=5, handshake=False)
    try:
        with pytest.raises(ServerError) as info:
            client.call("protocol_handshake", protocol.PROTOCOL_VERSION + 41)
        assert info.value.code == "version_mismatch"
        assert client.call("protocol_handshake", protocol.PROTOCOL_VERSION) == (
            protocol.PROTOCOL_VERSION,
            True,
        )
    finally:
        client.close()


def test_oversized_messages(fault_server: ServerProcess, raw: RawClient) -> None:
    big = b"x" * (1024**2 + 10)  # over the 1 MiB limit, under the transport cap
    reply = raw.error([*_enc(1, "commit_store", _key(), 1), protocol.encode(big)])
    assert reply.code == "message_too_large"
    # Far beyond the cap the transport drops the connection; the server keeps serving.
    huge = RawClient(fault_server.url)
    try:
        huge.send([*_enc(1, "noop"), b"y" * (3 * 1024**2)])
        assert not huge.sock.poll(500)
    finally:
        huge.close()
    with fault_server.client() as client:
        assert client.noop() == "noop"


def test_unknown_worker_and_missing_keys(fault_server: ServerProcess) -> None:
    with fault_server.client() as client:
        for op, args in (
            ("store", (_key(), 12345, [[0, 1, 2, 3]], b"")),
            ("retrieve", (_key(), 12345, [[0, 1, 2, 3]], b"", 0)),
            ("prepare_store", (_key(), 12345)),
            ("commit_retrieve", (_key(), 12345)),
        ):
            with pytest.raises(ServerError) as info:
                client.call(op, *args)
            assert info.value.code == "unknown_worker", op
        assert client.ping(12345) is False
    kv = make_kv(seed=None)
    worker = KVCacheWorker(
        kv, model_name="missing", server_url=fault_server.url, mode="engine_driven"
    )
    try:
        assert worker.retrieve(list(range(CHUNK_SIZE * 2)), list(range(8))) is False
        with pytest.raises(ServerError) as info:
            worker.client.commit_store(_key("missing"), worker.instance_id, b"")
        assert info.value.code == "not_found"
    finally:
        worker.close()


def test_shape_and_dtype_mismatch(fault_server: ServerProcess) -> None:
    model = f"mismatch-{uuid.uuid4().hex[:6]}"
    import torch

    src = make_kv(seed=5, dtype=torch.bfloat16)
    other = make_kv(seed=None, dtype=torch.float16)
    writer = KVCacheWorker(src, model_name=model, server_url=fault_server.url, mode="engine_driven")
    reader = KVCacheWorker(
        other, model_name=model, server_url=fault_server.url, mode="engine_driven"
    )
    try:
        tokens = list(range(CHUNK_SIZE))
        assert writer.store(tokens, [0, 1, 2, 3])
        with pytest.raises(ServerError) as info:
            reader.retrieve(tokens, [0, 1, 2, 3])
        assert info.value.code == "shape_mismatch"
        with pytest.raises(ServerError) as info:  # too few block ids for the range
            writer.client.store(writer.key(tokens), writer.instance_id, [[0, 1]], b"")
        assert info.value.code in ("unknown_worker", "shape_mismatch")
        with pytest.raises(ServerError) as info:  # wrong model for this worker
            writer.client.prepare_store(_key("other-model"), writer.instance_id)
        assert info.value.code == "bad_payload"
        # Inline data of the wrong size is refused, and pickles are refused outright.
        key = writer.key(list(range(100, 100 + CHUNK_SIZE)))
        writer.client.prepare_store(key, writer.instance_id)
        with pytest.raises(ServerError) as info:
            writer.client.commit_store(key, writer.instance_id, b"\x80\x04K\x01.")
        assert "pickle" in info.value.message
    finally:
        writer.close()
        reader.close()


def test_lmcache_driven_block_ids_out_of_range(fault_server: ServerProcess) -> None:
    kv = make_kv(shm=True, seed=6)
    worker = KVCacheWorker(kv, model_name="oob", server_url=fault_server.url, mode="lmcache_driven")
    try:
        with pytest.raises(ServerError) as info:
            worker.store(list(range(CHUNK_SIZE)), [0, 1, 2, 999])
        assert info.value.code == "shape_mismatch"
        assert worker.store(list(range(CHUNK_SIZE)), [0, 1, 2, 3])
    finally:
        worker.close()
        unlink_kv(kv)


def test_server_down_is_a_clear_error_not_a_hang() -> None:
    start = time.monotonic()
    with pytest.raises(ServerUnavailableError, match="is `lmcache server` running"):
        MPClient(free_url(), timeout=1, connect_timeout=0.5)
    assert time.monotonic() - start < 5


_KILLED_WORKER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {helpers!r})
    from mp_server_helpers import make_kv
    from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker
    from lmcache.v1.platform.cpu.shm import shm_segment_of
    mode = sys.argv[1]
    kv = make_kv(shm=mode == "lmcache_driven", seed=7)
    w = KVCacheWorker(kv, model_name="killed-" + mode, server_url={url!r}, mode=mode,
                      heartbeat_interval=0.3)
    tokens = list(range(4 * {chunk}))
    if mode == "engine_driven":
        w.client.prepare_store(w.key(tokens), w.instance_id)  # ...and die before commit
    print("READY", " ".join(sorted({{shm_segment_of(t) or "" for t in kv}})), flush=True)
    time.sleep(60)
    """
)


def _spawn_worker(server: ServerProcess, mode: str) -> tuple[subprocess.Popen[str], list[str]]:
    code = _KILLED_WORKER.format(
        helpers=os.path.dirname(os.path.dirname(__file__)), url=server.url, chunk=CHUNK_SIZE
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_MP_")}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, mode], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY"), line
    return proc, line.split()[1:]


def _wait_for(predicate: Any, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_worker_killed_mid_store_engine_driven(fault_server: ServerProcess) -> None:
    proc, _ = _spawn_worker(fault_server, "engine_driven")
    with fault_server.client() as client:
        assert client.get_stats().pending_prepares >= 1
        proc.kill()
        proc.wait(10)
        key = IPCCacheServerKey.from_token_ids(
            "killed-engine_driven", 1, None, range(4 * CHUNK_SIZE), request_id="probe"
        )
        client.lookup(key, 1)
        assert client.query_prefetch_status("probe") == 0  # nothing partial is visible
        assert _wait_for(lambda: client.get_stats().pending_prepares == 0)
        assert _wait_for(lambda: client.get_stats().engine_driven_workers == 0)


def test_worker_killed_lmcache_driven_shm_reclaimed(fault_server: ServerProcess) -> None:
    proc, segments = _spawn_worker(fault_server, "lmcache_driven")
    assert segments and all(os.path.exists(f"/dev/shm/{s.lstrip('/')}") for s in segments)
    proc.kill()
    proc.wait(10)
    with fault_server.client() as client:
        assert _wait_for(lambda: client.get_stats().lmcache_driven_workers == 0)
    assert _wait_for(lambda: not any(os.path.exists(f"/dev/shm/{s.lstrip('/')}") for s in segments))


def _segment_exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name.lstrip('/')}")


def _register_as_fake_peer(server: ServerProcess, segments: list[str]) -> int:
    """Register another process's KV segments under a new instance id and never call
    again (no heartbeat), as a careless or hostile peer would; the instance id."""
    import torch

    from lmcache.v1.platform.cpu.shm import CpuShmTensorWrapper, map_segment

    geo = SMALL_LAYOUT
    shape = (2, geo["num_blocks"], geo["block_size"], geo["num_heads"], geo["head_size"])
    nbytes = 2 * geo["num_blocks"] * geo["block_size"] * geo["num_heads"] * geo["head_size"] * 2
    layers = [map_segment(name, nbytes).view(torch.bfloat16).view(shape) for name in segments]
    wrappers = [CpuShmTensorWrapper.wrap(layer) for layer in layers]
    instance_id = int(uuid.uuid4().int % (1 << 31))
    with server.client() as client:
        client.register_kv_cache(
            instance_id, wrappers, "fake-peer", 1, "vllm", {"kv_layout": "NHD"}
        )
    return instance_id


def test_reaped_fake_peer_leaves_a_live_owners_segments(fault_server: ServerProcess) -> None:
    """A peer that registers a live worker's segments and goes silent is reaped, but the
    server must not unlink segments whose creator still runs; once the creator is
    SIGKILLed and reaped in turn, its segments are unlinked (no leak)."""
    victim, segments = _spawn_worker(fault_server, "lmcache_driven")
    try:
        assert segments and all(_segment_exists(s) for s in segments)
        fake_id = _register_as_fake_peer(fault_server, segments)
        assert _wait_for(lambda: f"reaped worker {fake_id}:" in fault_server.log()), (
            fault_server.log()[-3000:]
        )
        assert victim.poll() is None
        assert all(_segment_exists(s) for s in segments), "a live worker's segment was unlinked"
        assert fault_server.proc.poll() is None
        with Stored(fault_server) as stored:
            assert stored.retrieves_bit_exact()
    finally:
        victim.kill()
        victim.wait(10)
    assert _wait_for(lambda: not any(_segment_exists(s) for s in segments)), (
        "the SIGKILLed creator's segments leaked"
    )


def _flood(sock: zmq.Socket[Any], first_uid: int, count: int) -> int:
    """Send up to ``count`` get_stats requests without blocking; how many went out."""
    sent = 0
    for uid in range(first_uid, first_uid + count):
        try:
            sock.send_multipart(_enc(uid, "get_stats"), zmq.NOBLOCK)
        except zmq.Again:
            break
        sent += 1
    return sent


def test_client_that_never_reads_replies(fault_server: ServerProcess) -> None:
    """A client that never reads loses replies (counted as dropped_replies) while every
    other client keeps being served; every request gets one reply or one drop."""
    ctx = zmq.Context()
    hog = ctx.socket(zmq.DEALER)
    # Before connect(): queue and socket-buffer limits apply to connections made after.
    hog.setsockopt(zmq.LINGER, 0)
    hog.setsockopt(zmq.RCVHWM, 10)
    hog.setsockopt(zmq.RCVBUF, 4096)
    try:
        with fault_server.client(timeout=10) as other:
            dropped_before = other.get_stats().dropped_replies
            hog.connect(fault_server.url)
            sent = dropped = 0
            for served in range(1, 101):
                sent += _flood(hog, sent, 2000)
                assert other.ping()  # answered while the hog's replies pile up
                dropped = other.get_stats().dropped_replies - dropped_before
                if dropped > 100 and served >= 3:
                    break
            assert dropped > 100, f"{sent} requests sent, only {dropped} replies dropped"
            received = 0
            deadline = time.monotonic() + 60
            while received + dropped < sent and time.monotonic() < deadline:
                while hog.poll(200):  # what the hog's queues held
                    hog.recv_multipart()
                    received += 1
                dropped = other.get_stats().dropped_replies - dropped_before
            assert received + dropped == sent, (sent, received, dropped)
            assert not hog.poll(200)  # one reply or one drop per request, never both
            assert received < sent
            assert other.ping()
    finally:
        hog.close(0)
        ctx.term()


def test_error_reply_is_a_msgspec_struct() -> None:
    frames = protocol.encode_error(b"\x01", protocol.ErrorCode.INTERNAL, "boom", "store")
    reply = msgspec.msgpack.decode(frames[2], type=protocol.ErrorReply)
    assert reply == protocol.ErrorReply(code="internal", message="boom", operation="store")
