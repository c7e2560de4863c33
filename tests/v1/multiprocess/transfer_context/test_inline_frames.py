"""The framed inline sub-path: chunk bytes as their own ZMQ frames, bit-exact both ways,
malformed frames answered with typed errors, and the msgpack fallback."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from mp_server_helpers import BASE_ARGS, CHUNK_SIZE, ServerProcess, make_kv

from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.worker.client import ServerError
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

BLOCK = 4  # SMALL_LAYOUT's block size: CHUNK_SIZE // BLOCK blocks per chunk


@pytest.fixture(scope="module")
def inline_server(server_factory: Any) -> ServerProcess:
    """No shared memory: engine-driven workers must take the inline sub-path."""
    return server_factory("--supported-transfer-mode", "engine_driven", "--shm-name", "")


def _count_calls(worker: KVCacheWorker) -> dict[str, int]:
    """Counts the worker client's operations (framed ones go through ``call_bulk``)."""
    counts: dict[str, int] = {}
    real_bulk, real_call = worker.client.call_bulk, worker.client.call

    def bulk(operation: str, *args: Any, **kw: Any) -> Any:
        counts[operation] = counts.get(operation, 0) + 1
        return real_bulk(operation, *args, **kw)

    def call(operation: str, *args: Any, **kw: Any) -> Any:
        counts[operation] = counts.get(operation, 0) + 1
        return real_call(operation, *args, **kw)

    worker.client.call_bulk = bulk  # type: ignore[method-assign]
    worker.client.call = call  # type: ignore[method-assign]
    return counts


def _round_trip(url: str, tokens: list[int], dtype: torch.dtype, **geo: int) -> None:
    blocks = -(-len(tokens) // BLOCK)
    src, dst = make_kv(dtype=dtype, seed=3, **geo), make_kv(dtype=dtype, seed=None, **geo)
    with (
        KVCacheWorker(src, model_name=f"f{dtype}{geo}", server_url=url) as writer,
        KVCacheWorker(dst, model_name=f"f{dtype}{geo}", server_url=url) as reader,
    ):
        assert writer.sub_path == "inline"
        calls = _count_calls(writer)
        assert writer.store(tokens, list(range(blocks)))
        reads = _count_calls(reader)
        assert reader.retrieve(tokens, list(range(blocks, 2 * blocks)))
        assert calls.get("commit_store_frames") == 1 and "commit_store" not in calls
        assert reads.get("retrieve_frames") == 1 and "prepare_retrieve" not in reads
    for a, b in zip(src, dst):  # a partial last chunk travels too
        assert torch.equal(a[:, :blocks], b[:, blocks : 2 * blocks])
        assert not b[:, :blocks].any()


@pytest.mark.parametrize(
    ("dtype", "geo"),
    [
        (torch.bfloat16, {}),
        (torch.float32, {"num_heads": 3, "head_size": 5, "num_layers": 1}),
        (torch.float16, {"num_heads": 1, "head_size": 7, "num_layers": 5}),
    ],
)
def test_framed_inline_is_bit_exact(
    inline_server: ServerProcess, dtype: torch.dtype, geo: dict[str, int]
) -> None:
    _round_trip(inline_server.url, list(range(100, 100 + 3 * CHUNK_SIZE + 4)), dtype, **geo)


def test_skip_first_tokens_and_partial_hit(inline_server: ServerProcess) -> None:
    tokens = list(range(500, 500 + 3 * CHUNK_SIZE))
    src, dst = make_kv(seed=5), make_kv(seed=None)
    with (
        KVCacheWorker(src, model_name="p", server_url=inline_server.url) as writer,
        KVCacheWorker(dst, model_name="p", server_url=inline_server.url) as reader,
    ):
        assert writer.store(tokens[: 2 * CHUNK_SIZE], list(range(8)))
        # Partial hit: the third chunk is missing, so nothing is written.
        assert not reader.retrieve(tokens, list(range(12, 24)))
        assert not any(layer.any() for layer in dst)
        # Skipping the first chunk's tokens leaves its blocks alone.
        assert reader.retrieve(
            tokens[: 2 * CHUNK_SIZE], list(range(12, 20)), skip_first_n_tokens=16
        )
    for a, b in zip(src, dst):
        assert not b[:, 12:16].any()
        assert torch.equal(a[:, 4:8], b[:, 16:20])


@pytest.fixture
def prepared(inline_server: ServerProcess) -> Iterator[tuple[KVCacheWorker, Any, list[int]]]:
    """A registered inline worker and a prepared two-chunk store (key, chunk indices)."""
    with KVCacheWorker(make_kv(), model_name="bad", server_url=inline_server.url) as worker:
        tokens = list(range(900, 900 + 2 * CHUNK_SIZE))
        key = worker.key(tokens)
        context = worker.client.prepare_store(key, worker.instance_id).context
        yield worker, key, list(context["chunk_indices"])


def _commit(worker: KVCacheWorker, key: Any, indices: list[int], frames: list[bytes]) -> str:
    with pytest.raises(ServerError) as info:
        worker.client.call_bulk(
            "commit_store_frames", key, worker.instance_id, indices, frames=frames
        )
    assert worker.client.ping(worker.instance_id)  # the server is alive and answers
    return info.value.code


def test_malformed_frame_counts_and_sizes_get_typed_errors(
    prepared: tuple[KVCacheWorker, Any, list[int]],
) -> None:
    worker, key, indices = prepared
    assert indices == [0, 1]
    nbytes = worker.context.layout.chunk_nbytes(CHUNK_SIZE)  # type: ignore[union-attr]
    assert _commit(worker, key, indices, [b"\0" * nbytes]) == "bad_payload"  # one frame short
    # That commit consumed the prepare; every further commit must find nothing.
    assert _commit(worker, key, indices, [b"\0" * nbytes] * 2) == "not_found"
    worker.client.prepare_store(key, worker.instance_id)
    assert _commit(worker, key, indices, [b"\0" * (nbytes - 1)] * 2) == "shape_mismatch"
    worker.client.prepare_store(key, worker.instance_id)
    assert _commit(worker, key, [0, 5], [b"\0" * nbytes] * 2) == "bad_payload"
    too_many = [b""] * (protocol.MAX_BULK_FRAMES + 1)
    assert _commit(worker, key, indices, too_many) == "message_too_large"
    # Nothing half-written became visible.
    assert not worker.retrieve(list(range(900, 900 + 2 * CHUNK_SIZE)), list(range(8)))


def test_request_size_limit_covers_data_frames(server_factory: Any) -> None:
    server = server_factory(
        "--supported-transfer-mode", "engine_driven", "--shm-name", "", "--max-message-mb", "1"
    )
    with KVCacheWorker(make_kv(), model_name="big", server_url=server.url) as worker:
        key = worker.key(list(range(2 * CHUNK_SIZE)))
        frames = [b"\0" * (600 * 1024)] * 2
        assert _commit(worker, key, [0, 1], frames) == "message_too_large"


def test_falls_back_to_msgpack_without_framed_ops(inline_server: ServerProcess) -> None:
    """A server that answers unknown_operation (an earlier lmcache-core) gets msgpack data."""
    tokens = list(range(700, 700 + 2 * CHUNK_SIZE))
    src, dst = make_kv(seed=9), make_kv(seed=None)
    with (
        KVCacheWorker(src, model_name="old", server_url=inline_server.url) as writer,
        KVCacheWorker(dst, model_name="old", server_url=inline_server.url) as reader,
    ):
        for worker in (writer, reader):

            def refuse(operation: str, *args: Any, **kw: Any) -> Any:
                raise ServerError("unknown_operation", f"unknown {operation}", operation)

            worker.client.call_bulk = refuse  # type: ignore[method-assign]
        assert writer.store(tokens, list(range(8)))
        assert reader.retrieve(tokens, list(range(8, 16)))
    for a, b in zip(src, dst):
        assert torch.equal(a[:, :8], b[:, 8:16])


def _interface_address() -> str | None:
    """A local non-loopback IPv4 address of this machine, if it has one."""
    try:
        out = subprocess.run(
            ["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=5
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            return address
    return None


def test_inline_over_a_non_loopback_interface(tmp_path: Any) -> None:
    """Bound to the machine's own interface address with no shared memory at all."""
    address = _interface_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    server = ServerProcess(
        [*BASE_ARGS, "--host", address, "--supported-transfer-mode", "engine_driven",
         "--shm-name", ""],
        tmp_path / "server.log",
    )  # fmt: skip
    server.url = f"tcp://{address}:{server.port}"
    shm_before = _shm_mappings()
    try:
        server.wait_ready()
        with server.client() as client:
            before = client.get_stats()
        tokens = list(range(40, 40 + 2 * CHUNK_SIZE + 8))
        _round_trip(server.url, tokens, torch.bfloat16)
        with server.client() as client:
            after = client.get_stats()
    finally:
        server.stop()
    # The bytes went through the server's inline path (3 chunks each way) ...
    assert after.shm_name == ""
    assert after.stored_chunks - before.stored_chunks == 3
    assert after.retrieved_chunks - before.retrieved_chunks == 3
    # ... and this (the workers') process mapped no shared memory on the way.
    assert _shm_mappings() - shm_before == set()


def _shm_mappings() -> set[str]:
    """The shared-memory files this process has mapped now."""
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if "/dev/shm/" in line}


@pytest.fixture
def pipelined(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """Every chunk its own pipelined request; records each pipeline's request count."""
    from lmcache.v1.multiprocess.transfer_context import inline_frames
    from lmcache.v1.multiprocess.worker.client import MPClient

    monkeypatch.setattr(inline_frames, "PIPELINE_GROUP_BYTES", 1)
    counts: dict[str, list[int]] = {}
    real = MPClient.call_bulk_pipelined

    def counting(self: MPClient, operation: str, count: int, *args: Any, **kw: Any) -> None:
        counts.setdefault(operation, []).append(count)
        real(self, operation, count, *args, **kw)

    monkeypatch.setattr(MPClient, "call_bulk_pipelined", counting)
    return counts


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pipelined_inline_is_bit_exact(
    inline_server: ServerProcess, pipelined: dict[str, list[int]], dtype: torch.dtype
) -> None:
    """One request per chunk, two in flight: every byte lands where it belongs."""
    tokens = list(range(3000, 3000 + 4 * CHUNK_SIZE + 5))  # 5 chunks, the last partial
    blocks = -(-len(tokens) // BLOCK)
    src, dst = make_kv(dtype=dtype, seed=11), make_kv(dtype=dtype, seed=None)
    with (
        KVCacheWorker(src, model_name=f"pipe{dtype}", server_url=inline_server.url) as writer,
        KVCacheWorker(dst, model_name=f"pipe{dtype}", server_url=inline_server.url) as reader,
    ):
        assert writer.store(tokens, list(range(blocks)))
        assert reader.retrieve(tokens, list(range(blocks, 2 * blocks)))
        # Stored again: every group is already cached and commits no chunk.
        assert writer.store(tokens, list(range(blocks)))
    assert pipelined == {"commit_store_frames": [5, 5], "retrieve_frames": [5]}
    for a, b in zip(src, dst):
        assert torch.equal(a[:, :blocks], b[:, blocks : 2 * blocks])
        assert not b[:, :blocks].any()


def test_pipelined_skip_and_partial_hit(
    inline_server: ServerProcess, pipelined: dict[str, list[int]]
) -> None:
    tokens = list(range(6000, 6000 + 3 * CHUNK_SIZE))
    src, dst = make_kv(seed=13), make_kv(seed=None)
    with (
        KVCacheWorker(src, model_name="pp", server_url=inline_server.url) as writer,
        KVCacheWorker(dst, model_name="pp", server_url=inline_server.url) as reader,
    ):
        assert writer.store(tokens[: 2 * CHUNK_SIZE], list(range(8)))
        # The third chunk is missing: the retrieve fails (the engine recomputes the range).
        assert not reader.retrieve(tokens, list(range(12, 24)))
        for layer in dst:
            layer.zero_()
        # Skipping the first chunk and one block of the second: those blocks stay alone.
        assert reader.retrieve(
            tokens[: 2 * CHUNK_SIZE], list(range(12, 20)), skip_first_n_tokens=CHUNK_SIZE + BLOCK
        )
    for a, b in zip(src, dst):
        assert not b[:, 12:17].any()
        assert torch.equal(a[:, 5:8], b[:, 17:20])


def test_sent_chunks_are_unpinned_so_l1_can_evict_them(inline_server: ServerProcess) -> None:
    """Retrieved chunks stay pinned only while ZeroMQ sends them: once sent, L1 may evict
    them (least recently used first) to make room.  Had the reply frames leaked their pins,
    every retrieved chunk would survive the second round."""
    geo = {"num_layers": 8, "num_heads": 8, "head_size": 128, "num_blocks": 40}
    chunk_mib = 2 * 8 * CHUNK_SIZE * 8 * 128 * 2 / 1024**2  # 0.5 MiB per chunk
    per_request = 10  # chunks; 40 blocks
    requests = int(0.7 * 64 / chunk_mib) // per_request  # 70% of the 64 MiB L1 each round
    kv = make_kv(seed=1, **geo)
    with KVCacheWorker(kv, model_name="pin", server_url=inline_server.url) as worker:
        blocks = list(range(per_request * CHUNK_SIZE // BLOCK))
        rounds: list[list[list[int]]] = [[], []]
        for first in (0, 1):
            for r in range(requests):
                base = (first * 1000 + r + 1) * 100_000
                tokens = list(range(base, base + per_request * CHUNK_SIZE))
                rounds[first].append(tokens)
                assert worker.store(tokens, blocks)
                if first == 0:
                    assert all(worker.retrieve(tokens, blocks) for _ in range(3))
        assert all(worker.retrieve(tokens, blocks) for tokens in rounds[1][-2:])
        survivors = sum(worker.retrieve(tokens, blocks) for tokens in rounds[0])
        assert survivors < len(rounds[0])


def test_pipelined_falls_back_to_msgpack_without_framed_ops(
    inline_server: ServerProcess, pipelined: dict[str, list[int]]
) -> None:
    """A server without the framed operations answers the first pipelined request with
    unknown_operation: the store and the retrieve still complete (msgpack), bit-exact."""
    tokens = list(range(8000, 8000 + 3 * CHUNK_SIZE))
    src, dst = make_kv(seed=17), make_kv(seed=None)
    with (
        KVCacheWorker(src, model_name="oldpipe", server_url=inline_server.url) as writer,
        KVCacheWorker(dst, model_name="oldpipe", server_url=inline_server.url) as reader,
    ):
        for worker in (writer, reader):

            def refuse(operation: str, *args: Any, **kw: Any) -> Any:
                raise ServerError("unknown_operation", f"unknown {operation}", operation)

            worker.client.call_bulk = refuse  # type: ignore[method-assign]
            worker.client.call_bulk_pipelined = refuse  # type: ignore[method-assign]
        assert writer.store(tokens, list(range(12)))
        assert reader.retrieve(tokens, list(range(12, 24)))
        assert writer.context._framed is False  # type: ignore[union-attr]
    for a, b in zip(src, dst):
        assert torch.equal(a[:, :12], b[:, 12:24])
