"""End to end through a real server: every transfer path, bit-exact, many workers, TP=2."""

from __future__ import annotations

import threading
import uuid

import pytest
import torch
from mp_server_helpers import CHUNK_SIZE, ServerProcess, make_kv, unlink_kv

from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

PATHS = [
    pytest.param("engine_driven", "shm", id="engine-shm"),
    pytest.param("engine_driven", "inline", id="engine-inline"),
    pytest.param("lmcache_driven", None, id="lmcache-driven-cpu"),
]


def _worker(
    server: ServerProcess,
    kv: list[torch.Tensor],
    mode: str,
    sub: str | None,
    model: str,
    **kw: object,
) -> KVCacheWorker:
    return KVCacheWorker(kv, model_name=model, server_url=server.url, mode=mode, sub_path=sub, **kw)  # type: ignore[arg-type]


def _blocks_equal(
    src: list[torch.Tensor], src_ids: list[int], dst: list[torch.Tensor], dst_ids: list[int]
) -> bool:
    return all(torch.equal(s[:, src_ids], d[:, dst_ids]) for s, d in zip(src, dst))


@pytest.mark.parametrize(("mode", "sub"), PATHS)
def test_store_lookup_retrieve_bit_exact(
    auto_server: ServerProcess, mode: str, sub: str | None
) -> None:
    shm = mode == "lmcache_driven"
    model = f"e2e-{uuid.uuid4().hex[:8]}"
    src, dst = make_kv(shm=shm, seed=1), make_kv(shm=shm, seed=None)
    writer = _worker(auto_server, src, mode, sub, model)
    reader = _worker(auto_server, dst, mode, sub, model)
    try:
        assert writer.mode.value == mode
        if sub:
            assert writer.sub_path == sub
        tokens = list(range(7, 7 + 3 * CHUNK_SIZE + 4))  # 3 full chunks and a partial one
        src_ids = [3, 9, 1, 17, 22, 5, 30, 31, 40, 41, 2, 12, 13]
        assert reader.lookup(tokens) == 0
        assert writer.store(tokens, src_ids)
        assert reader.lookup(tokens) == len(tokens)
        assert reader.lookup(tokens[: 2 * CHUNK_SIZE + 3]) == 2 * CHUNK_SIZE
        dst_ids = [44, 43, 42, 39, 38, 37, 36, 35, 34, 33, 32, 29, 28]
        assert reader.retrieve(tokens, dst_ids)
        assert _blocks_equal(src, src_ids, dst, dst_ids)
        # A miss is an answer, not an error.
        assert not reader.retrieve([1, 2, 3] * CHUNK_SIZE, dst_ids[:12])
    finally:
        writer.close()
        reader.close()
        unlink_kv(src + dst)


@pytest.mark.parametrize(("mode", "sub"), PATHS)
def test_read_your_writes_many_times(
    auto_server: ServerProcess, mode: str, sub: str | None
) -> None:
    shm = mode == "lmcache_driven"
    model = f"ryw-{uuid.uuid4().hex[:8]}"
    kv = make_kv(shm=shm, seed=2)
    other = make_kv(shm=shm, seed=None)
    worker = _worker(auto_server, kv, mode, sub, model)
    observer = _worker(auto_server, other, mode, sub, model)
    try:
        for i in range(40):
            tokens = [i * 1000 + t for t in range(CHUNK_SIZE * 2)]
            ids = [(i + j) % 48 for j in range(8)]
            assert worker.store(tokens, ids)
            assert observer.lookup(tokens) == len(tokens), f"store {i} not visible"
    finally:
        worker.close()
        observer.close()
        unlink_kv(kv + other)


@pytest.mark.parametrize(("mode", "sub"), PATHS)
def test_four_concurrent_workers(auto_server: ServerProcess, mode: str, sub: str | None) -> None:
    shm = mode == "lmcache_driven"
    model = f"four-{uuid.uuid4().hex[:8]}"
    caches = [make_kv(shm=shm, seed=10 + w) for w in range(4)]
    workers = [_worker(auto_server, kv, mode, sub, model) for kv in caches]
    errors: list[BaseException] = []

    def run(w: int) -> None:
        try:
            for r in range(6):
                tokens = [w * 100000 + r * 1000 + t for t in range(CHUNK_SIZE * 2)]
                ids = list(range(w * 8, w * 8 + 8))
                assert workers[w].store(tokens, ids)
                # Read back through the next worker, into its blocks 40..47.
                reader = workers[(w + 1) % 4]
                assert reader.lookup(tokens) == len(tokens)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        fresh = make_kv(shm=shm, seed=None)
        reader = _worker(auto_server, fresh, mode, sub, model)
        try:
            for w in range(4):
                tokens = [w * 100000 + 5 * 1000 + t for t in range(CHUNK_SIZE * 2)]
                assert reader.retrieve(tokens, list(range(40, 48)))
                assert _blocks_equal(
                    caches[w], list(range(w * 8, w * 8 + 8)), fresh, list(range(40, 48))
                )
        finally:
            reader.close()
            unlink_kv(fresh)
    finally:
        for worker in workers:
            worker.close()
        for kv in caches:
            unlink_kv(kv)


@pytest.mark.parametrize(("mode", "sub"), [PATHS[0], PATHS[2]])
def test_tensor_parallel_two_ranks(auto_server: ServerProcess, mode: str, sub: str | None) -> None:
    shm = mode == "lmcache_driven"
    model = f"tp-{uuid.uuid4().hex[:8]}"
    caches = [make_kv(shm=shm, seed=20 + r) for r in range(2)]
    ranks = [
        _worker(auto_server, caches[r], mode, sub, model, world_size=2, rank=r) for r in range(2)
    ]
    try:
        tokens = list(range(500, 500 + 2 * CHUNK_SIZE))
        ids = list(range(8))
        assert ranks[0].store(tokens, ids)
        # Only rank 0 has it: the TP group does not hit.
        assert ranks[0].lookup(tokens, tp_size=2) == 0
        assert ranks[1].store(tokens, ids)
        assert ranks[0].lookup(tokens, tp_size=2) == len(tokens)
        # Keys carry the rank: each rank gets back its own shard.
        outs = [make_kv(shm=shm, seed=None) for _ in range(2)]
        readers = [
            _worker(auto_server, outs[r], mode, sub, model, world_size=2, rank=r) for r in range(2)
        ]
        try:
            for r in range(2):
                assert readers[r].retrieve(tokens, list(range(10, 18)))
                assert _blocks_equal(caches[r], ids, outs[r], list(range(10, 18)))
            assert not torch.equal(outs[0][0], outs[1][0])
        finally:
            for reader in readers:
                reader.close()
            for kv in outs:
                unlink_kv(kv)
    finally:
        for rank in ranks:
            rank.close()
        for kv in caches:
            unlink_kv(kv)


def test_skip_first_tokens_and_partial_ranges(auto_server: ServerProcess) -> None:
    model = f"skip-{uuid.uuid4().hex[:8]}"
    src, dst = make_kv(seed=3), make_kv(seed=None)
    writer = _worker(auto_server, src, "engine_driven", "shm", model)
    reader = _worker(auto_server, dst, "engine_driven", "shm", model)
    try:
        tokens = list(range(3 * CHUNK_SIZE))
        table = list(range(12))
        # Store chunk by chunk with the whole block table (start/end select the range).
        for c in range(3):
            assert writer.store(tokens, table, start=c * CHUNK_SIZE, end=(c + 1) * CHUNK_SIZE)
        assert reader.lookup(tokens) == len(tokens)
        out_table = list(range(20, 32))
        assert reader.retrieve(tokens, out_table, skip_first_n_tokens=CHUNK_SIZE)
        assert torch.count_nonzero(dst[0][:, 20:24]) == 0  # skipped blocks untouched
        assert _blocks_equal(src, table[4:], dst, out_table[4:])
        with pytest.raises(ValueError, match="multiple of the chunk size"):
            writer.store(tokens, table, start=3)
    finally:
        writer.close()
        reader.close()


def test_mla_layout(auto_server: ServerProcess) -> None:
    model = f"mla-{uuid.uuid4().hex[:8]}"
    src = [torch.randn(24, 4, 32, dtype=torch.float16) for _ in range(2)]
    dst = [torch.zeros(24, 4, 32, dtype=torch.float16) for _ in range(2)]
    writer = _worker(auto_server, src, "engine_driven", None, model)
    reader = _worker(auto_server, dst, "engine_driven", None, model)
    try:
        tokens = list(range(2 * CHUNK_SIZE))
        assert writer.store(tokens, list(range(8)))
        assert reader.retrieve(tokens, list(range(8, 16)))
        assert all(torch.equal(s[:8], d[8:16]) for s, d in zip(src, dst))
    finally:
        writer.close()
        reader.close()


def test_cache_salt_separates_entries(auto_server: ServerProcess) -> None:
    model = f"salt-{uuid.uuid4().hex[:8]}"
    kv = make_kv(seed=4)
    worker = _worker(auto_server, kv, "engine_driven", None, model)
    try:
        tokens = list(range(CHUNK_SIZE))
        assert worker.store(tokens, [0, 1, 2, 3], cache_salt="tenant-a")
        assert worker.lookup(tokens, cache_salt="tenant-a") == CHUNK_SIZE
        assert worker.lookup(tokens, cache_salt="tenant-b") == 0
        assert worker.lookup(tokens) == 0
    finally:
        worker.close()
