"""The transport's request memory: the in-flight byte budget (``--max-inflight-mb``) with
its ``busy`` reply, and the default request limit sized to the largest legal request."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import torch
import zmq
from large_senders import run_large_senders
from mp_server_helpers import CHUNK_SIZE, ServerProcess, Stored, free_port

from lmcache.v1.multiprocess.server import MPServer, build_cache_server
from lmcache.v1.multiprocess.server_config import (
    MPServerConfig,
    add_mp_server_args,
    config_from_args,
)
from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.wire.custom_types import MAX_TOKENS, IPCCacheServerKey
from lmcache.v1.multiprocess.worker.client import MPClient, ServerBusyError, ServerError
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker
from lmcache.v1.platform.transfer_mode import MPTransferMode

MiB = 1024**2


# -- in process: a handler that holds its request until released ----------------------------


class HeldServer:
    """An in-process server whose ``commit_store`` blocks until ``release`` is set, so
    requests stay in flight for as long as a test needs."""

    def __init__(self, max_message_bytes: int, max_inflight_bytes: int) -> None:
        self.release = threading.Event()
        self.held: list[int] = []
        engine = build_cache_server(
            MPServerConfig(
                chunk_size=CHUNK_SIZE,
                l1_size_gb=1 / 64,
                shm_name="",
                supported_transfer_mode=MPTransferMode.AUTO,
                disable_metrics=True,
            )
        )

        def held_commit_store(key: Any, instance_id: int, data: bytes = b"") -> bool:
            self.held.append(len(data))
            return self.release.wait(30)

        engine.commit_store = held_commit_store  # type: ignore[method-assign]
        config = MPServerConfig(
            port=free_port(),
            max_workers=4,
            max_message_bytes=max_message_bytes,
            max_inflight_bytes=max_inflight_bytes,
        )
        self.server = MPServer(config, engine)
        self.url = self.server.endpoint
        self._loop = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._loop.start()

    def wait_held(self, count: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.held) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.held) == count, f"{len(self.held)} requests held, expected {count}"

    def close(self) -> None:
        self.release.set()
        self.server.request_stop()
        self._loop.join(10)
        self.server.close()


@pytest.fixture
def held() -> Iterator[HeldServer]:
    server = HeldServer(max_message_bytes=4 * MiB, max_inflight_bytes=5 * MiB)
    yield server
    server.close()


def _key(n: int) -> IPCCacheServerKey:
    return IPCCacheServerKey.from_token_ids("m", 1, 0, range(n, n + CHUNK_SIZE))


class _Dealer:
    def __init__(self, ctx: zmq.Context[Any], url: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(url)

    def send_commit(self, uid: int, data: bytes) -> None:
        self.sock.send_multipart(protocol.encode_request(uid, "commit_store", [_key(uid), 1, data]))

    def reply(self, timeout_s: float = 10.0) -> tuple[int, str]:
        assert self.sock.poll(int(timeout_s * 1000)), "no reply"
        frames = self.sock.recv_multipart()
        code = "ok"
        if protocol.is_error_operation(protocol.decode(frames[1])):
            code = protocol.decode(frames[2], protocol.ErrorReply).code
        return protocol.decode(frames[0], int), code


def test_a_request_past_the_budget_gets_busy_at_once(held: HeldServer) -> None:
    data = b"x" * (2 * MiB)
    ctx: zmq.Context[Any] = zmq.Context()
    a, b, c = (_Dealer(ctx, held.url) for _ in range(3))
    try:
        a.send_commit(1, data)
        b.send_commit(2, data)
        held.wait_held(2)  # 4 MiB and a little in flight, under the 5 MiB budget
        in_flight = held.server.in_flight_bytes
        assert 4 * MiB < in_flight <= 5 * MiB
        c.send_commit(3, data)  # would pass the budget: refused while a and b are held
        assert c.reply() == (3, "busy")
        assert held.held == [2 * MiB, 2 * MiB], "a busy request must never reach its handler"
        assert held.server.in_flight_bytes == in_flight, "a busy request holds no budget"
        # Small requests are exempt: control traffic is answered while the budget is full.
        with MPClient(held.url, timeout=10) as client:
            assert client.noop() == "noop"
            assert client.get_chunk_size() == CHUNK_SIZE
            with pytest.raises(ServerBusyError) as info:
                client.commit_store(_key(4), 1, data)
        assert info.value.retryable and info.value.code == "busy"
        assert "--max-inflight-mb" in info.value.message
        held.release.set()
        assert sorted([a.reply(), b.reply()]) == [(1, "ok"), (2, "ok")]
        assert held.server.in_flight_bytes == 0
        c.send_commit(5, data)  # the very same request succeeds once the others are answered
        assert c.reply() == (5, "ok")
        assert held.server.in_flight_bytes == 0
    finally:
        for dealer in (a, b, c):
            dealer.sock.close(0)
        ctx.term()


def test_busy_is_a_typed_retryable_client_error() -> None:
    busy = MPClient._decode_reply
    frames = protocol.encode_error(protocol.encode(1), protocol.ErrorCode.BUSY, "full", "store")
    with pytest.raises(ServerBusyError) as info:
        busy(frames, "store", Any)
    assert info.value.retryable and info.value.code == "busy"
    other = protocol.encode_error(protocol.encode(1), protocol.ErrorCode.NOT_FOUND, "no", "x")
    with pytest.raises(ServerError) as plain:
        busy(other, "x", Any)
    assert not isinstance(plain.value, ServerBusyError) and not plain.value.retryable
    assert protocol.ErrorCode.BUSY.value in protocol.RETRYABLE_ERROR_CODES


def test_a_worker_store_over_the_budget_raises_server_busy(held: HeldServer) -> None:
    """KVCacheWorker (engine-driven, inline): the store fails with the typed, retryable
    error, and the same store succeeds once the budget has room."""
    # 16 chunks of 96 KiB: one request of 1.5 MiB, more than the budget has left.
    kv = [torch.randn(2, 64, 4, 8, 64).to(torch.bfloat16) for _ in range(3)]
    worker = KVCacheWorker(kv, model_name="busy", server_url=held.url, mode="engine_driven")
    ctx: zmq.Context[Any] = zmq.Context()
    filler = _Dealer(ctx, held.url)
    try:
        assert worker.sub_path == "inline"
        filler.send_commit(1, b"x" * (4 * MiB - 4096))  # about 4 of the 5 MiB budget
        held.wait_held(1)
        tokens, blocks = list(range(16 * CHUNK_SIZE)), list(range(64))
        with pytest.raises(ServerBusyError) as info:
            worker.store(tokens, blocks)
        assert info.value.retryable
        held.release.set()
        assert filler.reply() == (1, "ok")
        assert worker.store(tokens, blocks)
        assert worker.lookup(tokens) == len(tokens)
    finally:
        filler.sock.close(0)
        ctx.term()
        worker.close()


# -- the flags ---------------------------------------------------------------------------------


def _parse(*argv: str) -> MPServerConfig:
    import argparse

    return config_from_args(add_mp_server_args(argparse.ArgumentParser()).parse_args(argv))


def test_flags_and_defaults() -> None:
    config = _parse("--max-inflight-mb", "300", "--max-message-mb", "100")
    assert (config.max_inflight_bytes, config.max_message_bytes) == (300 * MiB, 100 * MiB)
    config.validate()
    default = _parse()
    assert default.max_message_bytes == protocol.DEFAULT_MAX_MESSAGE_BYTES == 169 * MiB
    assert default.max_inflight_bytes == protocol.DEFAULT_MAX_INFLIGHT_BYTES
    default.validate()
    with pytest.raises(ValueError, match="--max-inflight-mb"):
        _parse("--max-inflight-mb", "64", "--max-message-mb", "100").validate()


def test_config_file_key(tmp_path: Any) -> None:
    import argparse

    from lmcache.v1.multiprocess.server_config import apply_config_file, load_config_file

    path = tmp_path / "server.yaml"
    path.write_text("max-inflight-mb: 512\n")
    parser = add_mp_server_args(argparse.ArgumentParser())
    args = parser.parse_args([])
    apply_config_file(parser, args, load_config_file(str(path)), str(path))
    assert config_from_args(args).max_inflight_bytes == 512 * MiB


def test_the_largest_legal_request_fits_the_default_limit() -> None:
    """An inline store of one chunk group ending in the largest default chunk, under a key
    of MAX_TOKENS tokens each as long as msgpack makes them, is within the limit."""
    key = IPCCacheServerKey("m" * 1024, 1024, 1023, ((1 << 63) - 1,) * MAX_TOKENS, 0, MAX_TOKENS)
    indices = list(range(protocol.MAX_BULK_FRAMES))
    head = protocol.encode_request((1 << 63) - 1, "commit_store_frames", [key, -(1 << 63), indices])
    assert len(msgspec.msgpack.encode(key.token_ids)) == protocol.MAX_KEY_TOKEN_BYTES
    data = protocol.INLINE_GROUP_BYTES - 1 + protocol.LARGEST_DEFAULT_CHUNK_BYTES
    largest = sum(map(len, head)) + data
    assert largest <= protocol.DEFAULT_MAX_MESSAGE_BYTES < largest + MiB


# -- a real server process under concurrent large senders ---------------------------------------

SENDERS = 6
FRAMES_PER_SENDER = 4
FRAME_BYTES = 64 * MiB
MAX_MESSAGE_MB = 65
BUDGET_MB = 65
# The stated constant: interpreter and allocator slack on top of what the transport bounds.
RSS_SLACK = 96 * MiB


@pytest.fixture(scope="module")
def budget_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """One transfer thread, a budget of one large request, an L1 that holds every
    sender's prepared chunk (prefaulted: copying into it adds no RSS)."""
    return server_factory(
        "--supported-transfer-mode",
        "auto",
        "--max-gpu-workers",
        "1",
        "--l1-size-gb",
        "0.5",
        "--max-message-mb",
        str(MAX_MESSAGE_MB),
        "--max-inflight-mb",
        str(BUDGET_MB),
    )


def test_concurrent_large_senders_stay_within_the_budget(budget_server: ServerProcess) -> None:
    result = run_large_senders(
        budget_server.url,
        budget_server.proc.pid,
        SENDERS,
        FRAMES_PER_SENDER,
        FRAME_BYTES,
        CHUNK_SIZE,
        mode="store",
    )
    # Accepted requests <= the budget; each peer holds at most the one frame it is still
    # receiving (libzmq); the loop holds at most one more while it answers it busy.
    bound = BUDGET_MB * MiB + SENDERS * FRAME_BYTES + FRAME_BYTES + RSS_SLACK
    summary = (
        f"{SENDERS} senders x {FRAMES_PER_SENDER} x {FRAME_BYTES // MiB} MiB: replies "
        f"{dict(result.codes)}, missing {result.missing}, server RSS "
        f"{result.baseline_rss / MiB:.0f} -> peak {result.peak_rss / MiB:.0f} MiB "
        f"(+{result.peak_growth / MiB:.0f}, bound +{bound / MiB:.0f}), {result.elapsed_s:.1f}s"
    )
    print(summary)
    assert budget_server.proc.poll() is None, f"server died: {summary}\n{budget_server.log()}"
    assert result.missing == 0, summary
    assert result.codes["ok"] == SENDERS * FRAMES_PER_SENDER, summary
    assert set(result.codes) == {"ok", "busy"}, summary
    assert result.peak_growth <= bound, summary
    # It keeps serving: control traffic, and a store retrieved bit for bit.
    with budget_server.client() as client:
        assert client.noop() == "noop"
    with Stored(budget_server) as stored:
        assert stored.retrieves_bit_exact()
