"""``UnifiedLMCacheMPConnector`` against a real ``lmcache server``, with fake SGLang-side
objects (no SGLang needed): the calls SGLang 0.5.23's ``LMCacheUnifiedRadixCache`` makes,
in its order.

The KV pools live on the CPU; ``benchmarks/gpu_check.sh`` runs this file with
``LMCACHE_SGLANG_TEST_DEVICE=cuda`` (and ``LMCACHE_SGLANG_TEST_MODE`` to pick the transfer
mode) so the same calls go through the CUDA backend's transfer paths."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from lmcache.integration.sglang.lmcache_mp_metadata import (
    LMCacheExternalFlow,
    LMCachePendingStore,
)
from lmcache.integration.sglang.unified_lmcache_mp_connector import (
    UnifiedLMCacheMPConnector,
    server_url,
    slots_to_pages,
)
from lmcache.v1.config import LMCacheEngineConfig

PAGE = 16
CHUNK = 64
LAYERS, HEADS, HEAD_SIZE = 2, 2, 8
PAGES = 32  # SGLang's pool, page 0 being its padding page
DEVICE = os.environ.get("LMCACHE_SGLANG_TEST_DEVICE", "cpu")
MODE = os.environ.get("LMCACHE_SGLANG_TEST_MODE", "")  # "": the device's default


@dataclasses.dataclass
class FakeMHAPool:
    """SGLang's ``MHATokenToKVPool``: one ``[slots, heads, head_size]`` tensor per layer
    for K and one for V."""

    k_buffer: list[torch.Tensor]
    v_buffer: list[torch.Tensor]


class FakeAllocator:
    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def get_kvcache(self) -> Any:
        return self._pool


@dataclasses.dataclass(frozen=True)
class FakeComponent:
    name: str


@dataclasses.dataclass
class FakeModelConfig:
    model_path: str = "tiny-sglang-model"


def make_pool(seed: int) -> FakeMHAPool:
    gen = torch.Generator().manual_seed(seed)
    shape = (PAGES * PAGE, HEADS, HEAD_SIZE)
    return FakeMHAPool(
        [torch.randn(shape, generator=gen).to(DEVICE) for _ in range(LAYERS)],
        [torch.randn(shape, generator=gen).to(DEVICE) for _ in range(LAYERS)],
    )


def write_config(tmp_path: Path, url: str, name: str = "cfg.yaml") -> str:
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    path = tmp_path / name
    path.write_text(
        f"mp_host: {host}\nmp_port: {port}\nextra_config:\n  lmcache.mp.heartbeat_interval: 0.5\n"
    )
    return str(path)


def make_connector(config_file: str, pool: FakeMHAPool, **overrides: Any) -> Any:
    kwargs: dict[str, Any] = {
        "config_file": config_file,
        "model_config": FakeModelConfig(),
        "tp_size": 1,
        "tp_rank": 0,
        "tp_group": None,
        "page_size": PAGE,
        "token_to_kv_pool_allocator": FakeAllocator(pool),
        "req_to_token_pool": None,
        "tree_components": (FakeComponent("FULL"),),
        "mamba_component": None,
        "sliding_window_size": None,
    }
    kwargs.update(overrides)
    return UnifiedLMCacheMPConnector(**kwargs)


def slots(first_page: int, pages: int) -> torch.Tensor:
    return torch.arange(first_page * PAGE, (first_page + pages) * PAGE, dtype=torch.int64)


def tokens(n: int, offset: int = 0) -> list[int]:
    return [(offset + i) % 1000 + 1 for i in range(n)]


def kv_of(pool: FakeMHAPool, token_slots: torch.Tensor) -> torch.Tensor:
    planes = [*pool.k_buffer, *pool.v_buffer]
    return torch.stack([buf[token_slots.to(buf.device)] for buf in planes]).cpu()


def lookup(connector: Any, rid: str, ids: list[int], salt: str = "", local: int = 0) -> Any:
    operation = connector.submit_lookup(rid, ids, local_hit_tokens=local, cache_salt=salt)
    deadline = time.monotonic() + 10
    while (hit := connector.poll_lookup(operation)) is None:
        assert time.monotonic() < deadline, "lookup never completed"
        time.sleep(0.01)
    return operation, hit


def store(
    connector: Any, rid: str, ids: list[int], token_slots: torch.Tensor, salt: str = ""
) -> Any:
    operation = connector.submit_store(
        rid,
        ids,
        connector.device_indices_by_group(token_slots),
        device_indices_start=0,
        cache_salt=salt,
    )
    assert operation is not None
    assert connector.ready_prefix_count([operation]) == 1
    return operation


@pytest.fixture
def config(small_server: Any, tmp_path: Path) -> str:
    return write_config(tmp_path, small_server("--chunk-size", str(CHUNK)))


@pytest.mark.parametrize("mode", ["engine_driven", "lmcache_driven"])
def test_store_then_second_instance_loads_identical_kv(
    small_server: Any, tmp_path: Path, mode: str
) -> None:
    config = write_config(tmp_path, small_server("--chunk-size", str(CHUNK)), MODE or mode)
    writer_pool, reader_pool = make_pool(1), make_pool(2)
    writer = make_connector(config, writer_pool)
    reader = make_connector(config, reader_pool)
    try:
        assert writer.chunk_size == CHUNK
        ids = tokens(3 * CHUNK + 10)  # three whole chunks; the tail is never stored
        source = slots(1, 13)
        op = store(writer, "w", ids, source)
        assert (op.start, op.end) == (0, 3 * CHUNK)
        assert writer.complete_store(op) is True
        writer.finish_request("w")

        operation, hit = lookup(reader, "r", ids)
        assert hit == 3 * CHUNK and operation.locks_held
        target = slots(17, 12)
        load = reader.submit_load(operation, [target], local_hit_tokens=0)
        assert reader.prepare_load_on_stream(load, None) is True
        assert reader.ready_prefix_count([load]) == 1
        assert reader.complete_load(load) is True
        assert not operation.locks_held
        torch.testing.assert_close(
            kv_of(reader_pool, target), kv_of(writer_pool, source[: 3 * CHUNK]), rtol=0, atol=0
        )
    finally:
        writer.close()
        reader.close()


def test_load_after_local_hit_skips_the_pages_sglang_holds(config: str) -> None:
    writer_pool, reader_pool = make_pool(3), make_pool(4)
    writer = make_connector(config, writer_pool)
    reader = make_connector(config, reader_pool)
    try:
        ids = tokens(2 * CHUNK, offset=7)
        source = slots(1, 8)
        writer.complete_store(store(writer, "w", ids, source))
        # SGLang holds the first 80 tokens (5 pages) itself: chunk 1 loads from token 64,
        # and its first page (tokens 64..79) must stay as SGLang has it.
        operation, hit = lookup(reader, "r", ids, local=80)
        assert hit == 2 * CHUNK
        reader.free_lookup_locks("r", 0, CHUNK)  # SGLang frees the locks of its local chunk
        assert operation.lock_start == CHUNK
        padding_before = kv_of(reader_pool, slots(0, 1)).clone()
        target = slots(20, 3)  # tokens 80..127
        load = reader.submit_load(operation, [target], local_hit_tokens=80)
        assert (load.start, load.end) == (CHUNK, 2 * CHUNK)
        assert reader.complete_load(load) is True
        torch.testing.assert_close(
            kv_of(reader_pool, target), kv_of(writer_pool, source[80:128]), rtol=0, atol=0
        )
        # page 0 stood in for the page SGLang already holds: it was not written
        torch.testing.assert_close(kv_of(reader_pool, slots(0, 1)), padding_before, rtol=0, atol=0)
    finally:
        writer.close()
        reader.close()


def test_cache_salt_keeps_tenants_apart(config: str) -> None:
    connector = make_connector(config, make_pool(5))
    try:
        ids = tokens(CHUNK, offset=11)
        connector.complete_store(store(connector, "alice-1", ids, slots(1, 4), salt="alice"))
        connector.finish_request("alice-1")
        assert lookup(connector, "bob", ids, salt="bob")[1] == 0
        assert lookup(connector, "anon", ids, salt="")[1] == 0
        assert lookup(connector, "alice-2", ids, salt="alice")[1] == CHUNK
    finally:
        connector.close()


def test_store_is_incremental_and_skips_what_a_lookup_found(config: str) -> None:
    connector = make_connector(config, make_pool(6))
    try:
        ids = tokens(3 * CHUNK, offset=23)
        first = store(connector, "req", ids[: 2 * CHUNK], slots(1, 8))
        assert (first.start, first.end) == (0, 2 * CHUNK)
        assert connector.get_store_start("req", 3 * CHUNK) == 2 * CHUNK
        second = store(connector, "req", ids, slots(1, 12))
        assert (second.start, second.end) == (2 * CHUNK, 3 * CHUNK)
        assert (
            connector.submit_store(
                "req", ids, [slots(1, 12)], device_indices_start=0, cache_salt=""
            )
            is None
        )  # nothing new
        connector.finish_request("req")
        _, hit = lookup(connector, "other", ids)
        assert hit == 3 * CHUNK
        assert connector.get_store_start("other", 3 * CHUNK) == 3 * CHUNK
    finally:
        connector.close()


def test_killed_server_costs_misses_not_errors(small_server: Any, tmp_path: Path) -> None:
    url = small_server("--chunk-size", str(CHUNK))
    connector = make_connector(write_config(tmp_path, url), make_pool(7))
    try:
        ids = tokens(2 * CHUNK, offset=31)
        connector.complete_store(store(connector, "w", ids, slots(1, 8)))
        pending = connector.submit_lookup("p", ids, local_hit_tokens=0, cache_salt="")
        small_server.kill(url)
        started = time.monotonic()
        # A lookup sent before the server died is answered as a miss, not an error...
        assert connector.poll_lookup(pending) == 0 and not pending.locks_held
        # ... and so is one sent after.
        operation, hit = lookup(connector, "r", ids)
        assert hit == 0 and not operation.locks_held
        op = connector.submit_store("r2", ids, [slots(1, 8)], device_indices_start=0, cache_salt="")
        assert op is not None and connector.complete_store(op) is False
        connector.finish_request("r")
        assert time.monotonic() - started < 15
    finally:
        connector.close()


def test_a_restarted_server_gets_the_kv_cache_registered_again(
    small_server: Any, tmp_path: Path
) -> None:
    url = small_server("--chunk-size", str(CHUNK))
    connector = make_connector(write_config(tmp_path, url), make_pool(8))
    try:
        ids = tokens(CHUNK, offset=41)
        small_server.kill(url)
        small_server("--chunk-size", str(CHUNK), url=url)  # a new, empty server
        deadline = time.monotonic() + 20
        while True:  # the heartbeat notices the new incarnation and registers again
            op = connector.submit_store(
                "again", ids, [slots(1, 4)], device_indices_start=0, cache_salt=""
            )
            if op is not None and connector.complete_store(op):
                break
            assert time.monotonic() < deadline, "the KV cache was never registered again"
            connector.finish_request("again")
            time.sleep(0.2)
        connector.finish_request("again")
        assert lookup(connector, "check", ids)[1] == CHUNK
    finally:
        connector.close()


def test_flows_and_pending_stores_carry_sglang_fields() -> None:
    flow = LMCacheExternalFlow(key="k", lookup=None)  # type: ignore[arg-type]
    assert flow.total_hit is None and flow.load is None and not flow.cancelled
    flow.prefix_published = True
    pending = LMCachePendingStore(operation=None, node_id=3, lock_params="p")  # type: ignore[arg-type]
    assert pending.node_id == 3


def test_build_cache_salt() -> None:
    build = UnifiedLMCacheMPConnector.build_cache_salt
    assert build(None, None) == "" and build("t", None) == "t"
    assert build("t", "lora-1") != build("t", "lora-2") != build("t", None)
    assert build(None, "x") == build("", "x")


def test_config_needs_mp_host(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mp_host"):
        server_url(LMCacheEngineConfig.from_defaults())
    assert server_url(LMCacheEngineConfig.from_defaults(mp_host="127.0.0.1", mp_port=5)) == (
        "tcp://127.0.0.1:5"
    )
    assert server_url(LMCacheEngineConfig.from_defaults(mp_host="tcp://h", mp_port=6)) == (
        "tcp://h:6"
    )


def test_hybrid_models_are_refused_at_start(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "tcp://127.0.0.1:1")
    with pytest.raises(NotImplementedError, match="full attention"):
        make_connector(
            cfg, make_pool(0), tree_components=(FakeComponent("FULL"), FakeComponent("SWA"))
        )
    with pytest.raises(NotImplementedError, match="full attention"):
        make_connector(cfg, make_pool(0), mamba_component=object())


def test_slots_to_pages() -> None:
    assert slots_to_pages(slots(3, 2), PAGE) == [3, 4]
    assert slots_to_pages(torch.zeros(PAGE, dtype=torch.int64), PAGE) == [0]
    with pytest.raises(ValueError, match="whole pages"):
        slots_to_pages(slots(3, 1)[:-1], PAGE)
    with pytest.raises(ValueError, match="page-aligned"):
        slots_to_pages(slots(3, 1) + 1, PAGE)


def _tp_rank_main(rank: int, config: str, init_file: str, results: Any) -> None:
    """One SGLang TP rank: its own pool and connector, agreeing over a gloo group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        group = dist.new_group([0, 1], backend="gloo")
        kwargs = {"tp_size": 2, "tp_rank": rank, "tp_group": group}
        writer_pool, reader_pool = make_pool(10 + rank), make_pool(20 + rank)
        writer = make_connector(config, writer_pool, **kwargs)
        reader = make_connector(config, reader_pool, **kwargs)
        try:
            ids = tokens(2 * CHUNK, offset=53)
            source, target = slots(1, 8), slots(12, 8)
            assert writer.complete_store(store(writer, "w", ids, source))
            writer.finish_request("w")
            operation, hit = lookup(reader, "r", ids)
            load = reader.submit_load(operation, [target], local_hit_tokens=0)
            ok = reader.prepare_load_on_stream(load, None) and reader.complete_load(load)
            same = torch.equal(kv_of(reader_pool, target), kv_of(writer_pool, source))
            results.put((rank, hit, bool(ok), same, reader.is_lookup_leader))
        finally:
            writer.close()
            reader.close()
    finally:
        dist.destroy_process_group()


def test_two_tp_ranks_agree_and_each_loads_its_own_shard(config: str, tmp_path: Path) -> None:
    """TP=2: rank 0 alone asks the server, both ranks get the same hit, and each rank's
    shard (worker id = its rank) comes back into its own pool."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_tp_rank_main, args=(r, config, str(tmp_path / "init"), results))
        for r in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0, f"rank process exited with {proc.exitcode}"
    got = sorted(results.get(timeout=5) for _ in range(2))
    assert got == [(0, 2 * CHUNK, True, True, True), (1, 2 * CHUNK, True, True, False)]
