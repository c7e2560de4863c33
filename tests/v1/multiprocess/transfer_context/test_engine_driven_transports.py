"""Upstream 0.5.6's engine-driven API on lmcache-core: gather/scatter, transports, async store.

Upstream's own tests drive these with mocks; here they run on real tensors and, for the
transports and the asynchronous store, against a real server in both sub-paths.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import torch
from mp_server_helpers import CHUNK_SIZE, ServerProcess, make_kv

from lmcache.v1.multiprocess.transfer_context import async_engine_driven, engine_driven
from lmcache.v1.multiprocess.transfer_context.async_engine_driven import (
    AsyncEngineDrivenTransferContext,
)
from lmcache.v1.multiprocess.transfer_context.base import (
    EngineDrivenContext,
    compute_kv_layout,
    gather_paged_kv_to_cpu,
    scatter_cpu_to_paged_kv,
)
from lmcache.v1.multiprocess.transfer_context.transports import (
    EngineDrivenContextInline,
    EngineDrivenContextShm,
)
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

BLOCK = 4  # mp_server_helpers' SMALL_LAYOUT block size
PER_CHUNK = CHUNK_SIZE // BLOCK


def _kv(layers: int = 2, blocks: int = 10) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(2, blocks, BLOCK, 2, 8, generator=gen) for _ in range(layers)]


def test_gather_selected_chunks_into_caller_buffers() -> None:
    kv = _kv()
    ids = [7, 2, 5, 0, 9, 4]  # three chunks of two blocks
    out = [torch.full((2, 2, 2 * BLOCK, 16), -1.0) for _ in range(3)]  # one spare buffer
    chunks = gather_paged_kv_to_cpu(kv, ids, 2, out=out, chunk_indices=[2, 0])
    assert len(chunks) == 2 and chunks[0] is out[0] and chunks[1] is out[1]
    for chunk, blocks in zip(chunks, ([9, 4], [7, 2])):
        expected = torch.stack([t[:, blocks].reshape(2, 2 * BLOCK, 16) for t in kv], dim=1)
        assert torch.equal(chunk, expected)
    assert torch.equal(out[2], torch.full_like(out[2], -1.0))


def test_scatter_skips_whole_blocks_and_takes_a_partial_last_chunk() -> None:
    kv = _kv()
    chunks = gather_paged_kv_to_cpu(kv, [1, 2, 3, 4], 2)
    dst = [torch.zeros_like(t) for t in kv]
    # 5 tokens to skip: one whole block (the rest is logged and copied); the last chunk
    # gets one of its two blocks.
    scatter_cpu_to_paged_kv(dst, [6, 7, 8], chunks, 2, skip_first_n_tokens=BLOCK + 1)
    for src, out in zip(kv, dst):
        assert torch.equal(out[:, [7, 8]], src[:, [2, 3]])
        assert torch.count_nonzero(out[:, [0, 1, 2, 3, 4, 5, 6, 9]]) == 0
    with pytest.raises(ValueError, match="cannot fill"):
        scatter_cpu_to_paged_kv(dst, [6, 7], chunks, 2)


def test_layout_hints_and_mla() -> None:
    nhd = _kv(layers=1)
    hnd = [t.transpose(2, 3).contiguous() for t in nhd]  # [2, NB, NH, BS, HS]
    via_hint = gather_paged_kv_to_cpu(hnd, [3, 1], 2, layout_hints={"kv_layout": "HND"})
    assert torch.equal(via_hint[0], gather_paged_kv_to_cpu(nhd, [3, 1], 2)[0])
    mla = [torch.randn(6, BLOCK, 32) for _ in range(3)]
    assert compute_kv_layout(mla)[3:] == ("float32", compute_kv_layout(mla)[4], 1)
    chunk = gather_paged_kv_to_cpu(mla, [5, 0], 2)[0]
    assert chunk.shape == (3, 2 * BLOCK, 32)
    dst = [torch.zeros_like(t) for t in mla]
    scatter_cpu_to_paged_kv(dst, [1, 2], [chunk], 2)
    assert all(torch.equal(d[[1, 2]], s[[5, 0]]) for d, s in zip(dst, mla))


class _Passthrough(EngineDrivenContext):
    """Hides a native transport, so the context takes upstream's generic sequence."""

    def __init__(self, inner: EngineDrivenContext) -> None:
        super().__init__(inner.metadata, inner.req_client, inner.mq_timeout)
        self.inner = inner
        self.calls: list[str] = []

    def prepare_store(self, key: Any, instance_id: int) -> Any:
        self.calls.append("prepare_store")
        return self.inner.prepare_store(key, instance_id)

    def commit_store(self, key: Any, instance_id: int, chunks: list[torch.Tensor]) -> bool:
        self.calls.append("commit_store")
        return self.inner.commit_store(key, instance_id, chunks)

    def prepare_retrieve(self, key: Any, instance_id: int) -> Any:
        self.calls.append("prepare_retrieve")
        return self.inner.prepare_retrieve(key, instance_id)

    def commit_retrieve(self, key: Any, instance_id: int) -> bool:
        self.calls.append("commit_retrieve")
        return self.inner.commit_retrieve(key, instance_id)

    def close(self) -> None:
        self.inner.close()


def _reader(server: ServerProcess, model: str, sub: str) -> tuple[KVCacheWorker, list[Any]]:
    dst = make_kv(seed=None)
    return KVCacheWorker(
        dst, model_name=model, server_url=server.url, mode="engine_driven", sub_path=sub
    ), dst


TOKENS = list(range(5, 5 + 2 * CHUNK_SIZE + 3))  # two full chunks and a partial one
SRC_IDS = [30, 3, 17, 9, 41, 22, 5, 12, 40]


def _key(reader: KVCacheWorker) -> IPCCacheServerKey:
    return reader.key(TOKENS)


@pytest.mark.parametrize("sub", ["shm", "inline"])
def test_native_transports_through_the_generic_sequence(
    auto_server: ServerProcess, sub: str
) -> None:
    model = f"generic-{uuid.uuid4().hex[:8]}"
    src = make_kv(seed=5)
    client = auto_server.client()
    ctx = engine_driven.EngineDrivenTransferContext(4242, client, sub_path=sub)
    reader, dst = _reader(auto_server, model, sub)
    try:
        ctx.register(src, model, 1, PER_CHUNK, 10.0)
        native = ctx.engine_driven_context
        assert isinstance(
            native, EngineDrivenContextShm if sub == "shm" else EngineDrivenContextInline
        )
        hidden = _Passthrough(native)
        ctx._engine_driven_context = hidden
        key = _key(reader)
        assert ctx.submit_store("r", key, None, [SRC_IDS], None, 0).result()
        assert hidden.calls == ["prepare_store", "commit_store"]
        assert reader.lookup(TOKENS) == len(TOKENS)
        # Stored again: nothing to write, so neither gather nor a second commit.
        assert ctx.submit_store("r", key, None, [SRC_IDS], None, 0).result()
        assert hidden.calls[2:] == ["prepare_store"]
        # The generic retrieve, into the writer's own cache after wiping it.
        expected = [t[:, SRC_IDS].clone() for t in src]
        for t in src:
            t.zero_()
        assert ctx.submit_retrieve("r", key, None, [SRC_IDS], None, 0).result()
        assert hidden.calls[3:] == ["prepare_retrieve", "commit_retrieve"]
        assert all(torch.equal(t[:, SRC_IDS], e) for t, e in zip(src, expected))
        # And the native reader sees the same bytes.
        dst_ids = list(range(20, 20 + len(SRC_IDS)))
        assert reader.retrieve(TOKENS, dst_ids)
        assert all(torch.equal(d[:, dst_ids], e) for d, e in zip(dst, expected))
    finally:
        ctx.close()
        reader.close()
        client.close()


@pytest.mark.parametrize("sub", ["shm", "inline"])
def test_async_store_against_a_real_server(
    auto_server: ServerProcess, sub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The host's own stream and event types: real objects, no accelerator needed.
    monkeypatch.setattr(async_engine_driven, "torch_dev", torch.cpu)
    model = f"async-{uuid.uuid4().hex[:8]}"
    src = make_kv(seed=9)
    client = auto_server.client()
    ctx = AsyncEngineDrivenTransferContext(4343, client, sub_path=sub, commit_workers=2)
    reader, dst = _reader(auto_server, model, sub)
    try:
        ctx.register(src, model, 1, PER_CHUNK, 10.0)
        assert ctx.sub_path == sub
        future = ctx.submit_store(
            "r", _key(reader), None, [SRC_IDS], ctx.create_recorded_event(), 0
        )
        ctx.flush_inflight_stores()
        assert future.result(timeout=10) is True
        dst_ids = list(range(20, 20 + len(SRC_IDS)))
        assert reader.retrieve(TOKENS, dst_ids)
        assert all(torch.equal(d[:, dst_ids], s[:, SRC_IDS]) for d, s in zip(dst, src))
        # Without the engine's event the store cannot be ordered after the forward pass.
        with pytest.raises(RuntimeError, match="event"):
            ctx.submit_store("r", _key(reader), None, [SRC_IDS], None, 0).result()
    finally:
        ctx.close()
        reader.close()
        client.close()
    # After close a store is refused at once, without touching the server.
    assert ctx.submit_store("r", object(), None, [SRC_IDS], object(), 0).result() is False


@pytest.mark.parametrize("sub", ["shm", "inline"])
def test_storing_a_stored_key_again(auto_server: ServerProcess, sub: str) -> None:
    """Nothing left to write still ends in a commit the server takes (inline: empty data)."""
    kv = make_kv(seed=2)
    worker = KVCacheWorker(
        kv,
        model_name=f"again-{uuid.uuid4().hex[:8]}",
        server_url=auto_server.url,
        mode="engine_driven",
        sub_path=sub,
    )
    try:
        tokens = list(range(CHUNK_SIZE))
        assert worker.store(tokens, [0, 1, 2, 3])
        assert worker.store(tokens, [0, 1, 2, 3])
        assert worker.lookup(tokens) == CHUNK_SIZE
    finally:
        worker.close()
