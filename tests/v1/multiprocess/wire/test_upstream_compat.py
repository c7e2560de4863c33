"""Regressions for the mismatches found against the published upstream LMCache 0.5.6
(``tests_interop/``); none of these needs upstream installed.  docs/compatibility.md lists
each one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
import torch
import zmq
from mp_server_helpers import CHUNK_SIZE, ServerProcess, free_port, make_kv, unlink_kv

from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.wire.chunking import hit_chunks_to_tokens
from lmcache.v1.multiprocess.wire.custom_types import (
    BlockAllocationRecord,
    IPCCacheServerKey,
    RegisterEngineDrivenContextPayload,
    RegisterEngineDrivenContextResponse,
)
from lmcache.v1.multiprocess.worker.client import MPClient, ServerError
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker
from lmcache.v1.platform.cpu.event_ipc import UPSTREAM_STUB_EVENT_HANDLE, HostEventIPCBackend
from lmcache.v1.platform.cpu.shm import CpuShmTensorWrapper, empty_shm_tensor

BLOCK = 4


@pytest.fixture(scope="module")
def auto_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory("--supported-transfer-mode", "auto")


@pytest.fixture(scope="module")
def no_shm_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    return server_factory("--supported-transfer-mode", "auto", "--shm-name", "")


# -- a stand-in for upstream's server: no protocol_handshake, canned replies ------------------


class FakeUpstreamServer:
    """A ROUTER that behaves like upstream 0.5.6's transport: unknown operations (our
    ``protocol_handshake``) are dropped without a reply; known ones get canned answers."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, list[bytes]]] = []
        self.port = free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.bind(self.url)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(50):
                continue
            identity, uid, op_frame, *payloads = self._sock.recv_multipart()
            raw = msgspec.msgpack.decode(op_frame)
            name = (
                {v: k for k, v in protocol.LEGACY_OPERATION_IDS.items()}.get(raw)
                if isinstance(raw, int)
                else raw
            )
            self.requests.append((str(name), payloads))
            if name not in self.answers:
                continue  # upstream logs "No handler registered" and never replies
            answer = self.answers[name]
            reply = [identity, uid, op_frame]
            if answer is not None:
                reply.append(protocol.encode(answer))
            self._sock.send_multipart(reply)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(0)
        self._ctx.term()


@pytest.fixture
def fake_upstream() -> Iterator[Callable[[dict[str, Any]], FakeUpstreamServer]]:
    made: list[FakeUpstreamServer] = []

    def make(answers: dict[str, Any]) -> FakeUpstreamServer:
        server = FakeUpstreamServer({"noop": "noop", "get_chunk_size": CHUNK_SIZE, **answers})
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


# -- 1. error replies readable by upstream's client --------------------------------------------


def test_error_op_frame_carries_code_and_message() -> None:
    """Upstream's client reads only the op frame of a reply and raises
    ``ValueError(f"Response operation {op!r} does not match request ...")``."""
    frames = protocol.encode_error(b"\x01", protocol.ErrorCode.BAD_PAYLOAD, "why", "store")
    op = msgspec.msgpack.decode(frames[1])
    assert op == "__error__ bad_payload: why"
    assert protocol.is_error_operation(op)
    assert not protocol.is_error_operation("store") and not protocol.is_error_operation(6)


def test_error_reply_on_the_wire_names_the_reason(auto_server: ServerProcess) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.connect(auto_server.url)
        sock.send_multipart(protocol.encode_request(1, "ping", ["not an int"]))
        assert sock.poll(5000)
        reply = sock.recv_multipart()
    finally:
        sock.close(0)
        ctx.term()
    op = msgspec.msgpack.decode(reply[1])
    assert op.startswith("__error__ bad_payload: ping: payload 0")


# -- 2. prefetch status in chunks ----------------------------------------------------------


def test_prefetch_status_counts_chunks(auto_server: ServerProcess) -> None:
    kv = make_kv(shm=True)
    tokens = list(range(100, 100 + 2 * CHUNK_SIZE + CHUNK_SIZE // 2))  # 2.5 chunks
    blocks = list(range(len(tokens) // BLOCK + 1))
    try:
        with KVCacheWorker(
            kv, model_name="chunks", server_url=auto_server.url, mode="lmcache_driven"
        ) as worker:
            assert worker.store(tokens, blocks)
            key = worker.key(tokens, request_id="r-chunks", worker_id=None)
            worker.client.lookup(key, 1)
            assert worker.client.query_prefetch_status("r-chunks") == 3  # partial counts
            assert worker.client.wait_prefetch_status("r-chunks", 0.0) == 3
            worker.end_session("r-chunks")
            assert worker.lookup(tokens) == len(tokens)  # tokens again on our API
            assert worker.lookup(tokens[: 2 * CHUNK_SIZE]) == 2 * CHUNK_SIZE
    finally:
        unlink_kv(kv)


def test_hit_chunks_to_tokens() -> None:
    assert hit_chunks_to_tokens(None, 16, 40) == 0
    assert hit_chunks_to_tokens(2, 16, 40) == 32
    assert hit_chunks_to_tokens(3, 16, 40) == 40  # trailing partial chunk


# -- 3. upstream's CPU event handle ---------------------------------------------------------


def test_host_events_accept_upstream_stub_handle() -> None:
    event = HostEventIPCBackend().import_event(UPSTREAM_STUB_EVENT_HANDLE, "cpu")
    assert event.query()
    with pytest.raises(ValueError, match="8 bytes"):
        HostEventIPCBackend().import_event(b"abc", "cpu")


def test_store_with_upstream_stub_handle(auto_server: ServerProcess) -> None:
    kv = make_kv(shm=True)
    tokens = list(range(300, 300 + CHUNK_SIZE))
    try:
        with KVCacheWorker(
            kv, model_name="stub", server_url=auto_server.url, mode="lmcache_driven"
        ) as worker:
            key = worker.key(tokens)
            blocks = [list(range(CHUNK_SIZE // BLOCK))]
            handle, ok = worker.client.store(
                key, worker.instance_id, blocks, UPSTREAM_STUB_EVENT_HANDLE
            )
            assert ok and handle == b""
    finally:
        unlink_kv(kv)


# -- 4. layout hints -----------------------------------------------------------------------


def _wrapped_kv() -> tuple[list[torch.Tensor], list[CpuShmTensorWrapper]]:
    kv = [empty_shm_tensor((2, 8, BLOCK, 2, 8), torch.bfloat16) for _ in range(2)]
    return kv, [CpuShmTensorWrapper.wrap(t) for t in kv]


@pytest.mark.parametrize("kv_layout", ["BLHNC", "BLNHC", "LHBNC"])
def test_server_refuses_layouts_it_would_misread(
    auto_server: ServerProcess, kv_layout: str
) -> None:
    kv, wrappers = _wrapped_kv()
    try:
        with auto_server.client() as client:
            with pytest.raises(ServerError) as info:
                client.register_kv_cache(7, wrappers, "m", 1, "vllm", {"kv_layout": kv_layout})
            assert info.value.code == "shape_mismatch" and kv_layout in str(info.value)
            client.register_kv_cache(8, wrappers, "m", 1, "vllm", {"kv_layout": "NHD"})
            client.unregister_kv_cache(8)
    finally:
        unlink_kv(kv)


def test_non_string_kv_layout_is_a_bad_payload(auto_server: ServerProcess) -> None:
    kv, wrappers = _wrapped_kv()
    try:
        with auto_server.client() as client:
            with pytest.raises(ServerError) as info:
                client.register_kv_cache(7, wrappers, "m", 1, "vllm", {"kv_layout": 3})
            assert info.value.code == "bad_payload"
    finally:
        unlink_kv(kv)


HND_NB, HND_NH, HND_HS = 8, 2, 8


def _engine_tensor(nhd: torch.Tensor, form: str) -> torch.Tensor:
    """``nhd`` (``[2, NB, BS, NH, HS]``) in an engine's HND form, copied into SHM."""
    if form == "two_major":  # [2, NB, NH, BS, HS]
        engine = nhd.transpose(2, 3)
    elif form == "blocks_first":  # [NB, 2, NH, BS, HS]
        engine = nhd.permute(1, 0, 3, 2, 4)
    else:  # vLLM CPU attention: [NB, NH, BS, 2*HS], K then V along the last axis
        engine = nhd.permute(1, 3, 2, 0, 4).flatten(3)
    out = empty_shm_tensor(tuple(engine.shape), nhd.dtype)
    out.copy_(engine)
    return out


@pytest.mark.parametrize("form", ["two_major", "blocks_first", "vllm_cpu_fused"])
def test_hnd_declared_cache_is_read_as_nhd(auto_server: ServerProcess, form: str) -> None:
    """Upstream's connector in vLLM-CPU registers head-major pages with
    ``{"kv_layout": "HND"}``: a chunk stored from them comes back into an NHD cache equal to
    the same K/V values, block for block (and a wrong re-view would scramble them)."""
    gen = torch.Generator().manual_seed(5)
    shape = (2, HND_NB, BLOCK, HND_NH, HND_HS)
    nhd = [torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(2)]
    hnd_kv = [_engine_tensor(layer, form) for layer in nhd]
    nhd_kv = [empty_shm_tensor(shape, torch.bfloat16) for _ in range(2)]
    for layer in nhd_kv:
        layer.zero_()
    tokens = list(range(500, 500 + CHUNK_SIZE))
    key = IPCCacheServerKey.from_token_ids("hnd", 1, 0, tokens)
    stored = [5, 1, 7, 2]  # CHUNK_SIZE // BLOCK blocks, out of order
    loaded = [0, 3, 4, 6]
    try:
        with auto_server.client() as client:
            hnd = [CpuShmTensorWrapper.wrap(t) for t in hnd_kv]
            client.register_kv_cache(21, hnd, "hnd", 1, "vllm", {"kv_layout": "HND"})
            _, ok = client.store(key, 21, [stored], UPSTREAM_STUB_EVENT_HANDLE)
            assert ok
            out = [CpuShmTensorWrapper.wrap(t) for t in nhd_kv]
            client.register_kv_cache(22, out, "hnd", 1, "vllm", {"kv_layout": "NHD"})
            _, ok = client.retrieve(key, 22, [loaded], UPSTREAM_STUB_EVENT_HANDLE)
            assert ok
            client.unregister_kv_cache(21)
            client.unregister_kv_cache(22)
        for src, dst in zip(nhd, nhd_kv):
            assert torch.equal(dst[:, loaded], src[:, stored])
            untouched = [b for b in range(HND_NB) if b not in loaded]
            assert not dst[:, untouched].any()
    finally:
        unlink_kv(hnd_kv + nhd_kv)


def test_register_kv_cache_sends_a_dict_naming_nhd(fake_upstream: Any) -> None:
    """Upstream decodes ``layout_hints`` as a dict (a nil is dropped) and, without a
    ``kv_layout``, reads ``[2, NB, BS, NH, HS]`` as HND."""
    server = fake_upstream({"register_kv_cache": None, "unregister_kv_cache": None})
    kv = make_kv(shm=True)
    try:
        with KVCacheWorker(
            kv, model_name="m", server_url=server.url, mode="lmcache_driven", timeout=5
        ) as worker:
            assert worker.client.server_is_upstream
        ((_, payloads),) = [r for r in server.requests if r[0] == "register_kv_cache"]
        assert len(payloads) == 7
        assert msgspec.msgpack.decode(payloads[5]) == {"kv_layout": "NHD"}
        assert msgspec.msgpack.decode(payloads[4]) == "vllm"
    finally:
        unlink_kv(kv)


# -- 5. pickle sub-path refused -------------------------------------------------------------


def test_undeclared_engine_driven_worker_without_shm_is_refused(
    no_shm_server: ServerProcess,
) -> None:
    """An upstream worker on a server without SHM would pickle; refused at prepare."""
    payload = RegisterEngineDrivenContextPayload(
        instance_id=11, model_name="pk", world_size=1, block_size=BLOCK, num_layers=2,
        hidden_dim_size=16, dtype_str="bfloat16", use_mla=False,
    )  # fmt: skip
    key = IPCCacheServerKey.from_token_ids("pk", 1, 0, list(range(CHUNK_SIZE)))
    with no_shm_server.client() as client:
        response = client.register_kv_cache_engine_driven_context(payload)
        assert response.shm_name == "" and response.pool_size == 0
        for call in (client.prepare_store, client.prepare_retrieve):
            with pytest.raises(ServerError) as info:
                call(key, 11)
            assert info.value.code == "unsupported_transfer_mode"
            assert "pickle sub-path" in str(info.value)
        client.unregister_kv_cache_engine_driven_context(11)


def test_inline_worker_declares_itself_and_works_without_shm(
    no_shm_server: ServerProcess,
) -> None:
    kv = make_kv()
    tokens = list(range(CHUNK_SIZE))
    with KVCacheWorker(
        kv, model_name="inl", server_url=no_shm_server.url, mode="engine_driven"
    ) as worker:
        assert worker.sub_path == "inline"
        assert worker.store(tokens, list(range(CHUNK_SIZE // BLOCK)))
        assert worker.lookup(tokens) == CHUNK_SIZE


def test_pickled_commit_store_is_refused_with_reason(no_shm_server: ServerProcess) -> None:
    kv = make_kv()
    tokens = list(range(500, 500 + CHUNK_SIZE))
    with KVCacheWorker(
        kv, model_name="pkl", server_url=no_shm_server.url, mode="engine_driven"
    ) as worker:
        key = worker.key(tokens)
        worker.client.prepare_store(key, worker.instance_id)
        with pytest.raises(ServerError) as info:
            worker.client.commit_store(key, worker.instance_id, b"\x80\x04pickle")
        assert info.value.code == "bad_payload" and "never unpickles" in str(info.value)


# -- 6. upstream server detection -----------------------------------------------------------


def test_client_detects_upstream_server(fake_upstream: Any, auto_server: ServerProcess) -> None:
    server = fake_upstream({})
    with MPClient(server.url, timeout=5, connect_timeout=5) as client:
        assert client.server_is_upstream
        assert client.get_chunk_size() == CHUNK_SIZE
    with auto_server.client() as client:
        assert not client.server_is_upstream


def test_inline_sub_path_refused_against_upstream_without_shm(fake_upstream: Any) -> None:
    server = fake_upstream(
        {
            "register_kv_cache_engine_driven_context": RegisterEngineDrivenContextResponse(),
            "unregister_kv_cache_engine_driven_context": None,
        }
    )
    with pytest.raises(ValueError, match="expects pickled chunks"):
        KVCacheWorker(make_kv(), model_name="m", server_url=server.url, mode="engine_driven")
    ops = [name for name, _ in server.requests]
    assert "set_engine_driven_sub_path" not in ops  # unknown upstream: would never answer
    assert ops[-1] == "unregister_kv_cache_engine_driven_context"


# -- 7. report_block_allocation -------------------------------------------------------------


def test_report_block_allocation_is_accepted(auto_server: ServerProcess) -> None:
    with auto_server.client() as client:
        errors = client.get_stats().errors
        records = [BlockAllocationRecord(req_id="r", new_block_ids=[1], new_token_ids=[5])]
        assert client.call("report_block_allocation", 42, "m", records) is None
        assert client.get_stats().errors == errors


def test_upstream_codec_names_round_trip_wire_types() -> None:
    from lmcache.v1.multiprocess.custom_types import (
        IPCCacheServerKey,
        get_customized_decoder,
        get_customized_encoder,
    )

    key = IPCCacheServerKey("m", 1, 0, (1, 2, 3), 0, 3)
    data = get_customized_encoder(IPCCacheServerKey).encode(key)
    assert get_customized_decoder(IPCCacheServerKey).decode(data) == key
    dtype_data = get_customized_encoder(torch.dtype).encode(torch.bfloat16)
    assert get_customized_decoder(torch.dtype).decode(dtype_data) is torch.bfloat16
    with pytest.raises(msgspec.ValidationError):
        get_customized_decoder(torch.dtype).decode(get_customized_encoder(int).encode(5))
