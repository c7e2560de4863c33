"""``LMCacheHiCacheStorage`` with SGLang's real CPU pools, created by SGLang's own
``StorageBackendFactory`` (``--hicache-storage-backend dynamic``), against a real
``lmcache server``: bit-exact round trips through every host layout, prefix semantics,
the v2 pool transfers, the legacy tensor API, SGLang's random-failure injector, a server
that dies (misses within a bound, never an exception), and rank, tenant and format
isolation.

Needs SGLang (the ``sglang-cpu`` nox session runs these files, ``-m sglang``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from prerequisites import require_module
from small_servers import SmallServers

require_module(
    "sglang.srt.mem_cache.storage.backend_factory",
    "SGLang's HiCache storage factory (the sglang-cpu nox session installs SGLang)",
    required_env="LMCACHE_TEST_REQUIRE_SGLANG",
)

from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageConfig,
    HiCacheStorageFailureInjector,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

from lmcache.integration.sglang.hicache_storage import (  # noqa: E402
    CONFIG_KEYS,
    LMCacheHiCacheStorage,
)
from lmcache.v1.multiprocess.worker.client import (  # noqa: E402
    MPClient,
    free_url,
)

pytestmark = pytest.mark.sglang

PAGE_SIZE = 4
LAYERS = 2
HEADS = 2
HEAD_DIM = 8
MODULE = "lmcache.integration.sglang.hicache_storage"
LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


# -- a real server -----------------------------------------------------------------------------


class Servers(SmallServers):
    """``lmcache server`` processes with a 16 MiB L1 outside shared memory."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir, l1_size_gb=0.015625)

    def start(self, url: str | None = None) -> str:
        """A server at ``url`` (a restart of a killed one) or on a free port."""
        return self("--shm-name", "", url=url)


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    servers = Servers(tmp_path_factory.mktemp("hicache-server"))
    yield servers.start()
    servers.stop_all()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    made = Servers(tmp_path)
    yield made
    made.stop_all()


# -- SGLang's pools and factory ------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_host_memory_reserve(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang refuses a host pool unless 10 GiB of RAM stay free besides it (a production
    guard); these pools are a few KiB, and the test machine's free RAM varies."""
    import sglang.srt.mem_cache.pool_host.base as pool_host_base

    monkeypatch.setattr(pool_host_base, "HICACHE_HOST_MEMORY_RESERVE_BYTES", 0)


def host_pool(layout: str = "page_first", dtype: torch.dtype = torch.bfloat16) -> Any:
    device = MHATokenToKVPool(64, PAGE_SIZE, dtype, HEADS, HEAD_DIM, LAYERS, "cpu", False)
    return MHATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info,
        2.0,
        0,
        PAGE_SIZE,
        layout,
        pin_memory=False,
        device_capacity_tokens=device.size,
        start_layer=device.start_layer,
        end_layer=device.end_layer,
        write_back_staging=device.hicache_write_back_staging,
    )


def storage_config(url: str, *, tp_rank: int = 0, tp_size: int = 1, mla: bool = False,
                   **extra: Any) -> HiCacheStorageConfig:  # fmt: skip
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="tiny/llama",
        extra_config={
            "backend_name": "lmcache",
            "module_path": MODULE,
            "class_name": "LMCacheHiCacheStorage",
            "interface_v1": 1,
            "lmcache_url": url,
            "timeout_s": 5.0,
            **extra,
        },
    )


@pytest.fixture
def make_backend() -> Iterator[Callable[..., Any]]:
    """``make_backend(config, pool)``: SGLang's factory creates the backend (``dynamic``)
    and registers the host pool as SGLang's cache controller does; closed at teardown."""
    made: list[Any] = []

    def make(config: HiCacheStorageConfig, pool: Any) -> Any:
        backend = StorageBackendFactory.create_backend("dynamic", config, pool)
        backend.register_mem_pool_host(pool)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


_page_seed = iter(range(1, 1 << 30))


def fill_pages(pool: Any, pages: int) -> torch.Tensor:
    """Allocate ``pages`` pages of the host pool and fill them with random values."""
    indices = pool.alloc(pages * PAGE_SIZE)
    assert indices is not None
    gen = torch.Generator().manual_seed(next(_page_seed))
    for p in range(pages):
        page = pool.get_dummy_flat_data_page()
        page.copy_(torch.randn(page.shape, generator=gen).to(page.dtype))
        pool.set_from_flat_data_page(int(indices[p * PAGE_SIZE]), page)
    return indices


def page_bytes(pool: Any, indices: torch.Tensor, page: int) -> bytes:
    data = pool.get_data_page(int(indices[page * PAGE_SIZE]), flat=True)
    return bytes(data.contiguous().view(torch.uint8).numpy())


def keys_for(name: str, count: int) -> list[str]:
    return [f"{name}-{os.getpid()}-{time.monotonic_ns()}-{i}" for i in range(count)]


# -- tests -------------------------------------------------------------------------------------


def test_the_factory_loads_it_as_a_dynamic_backend(
    server_url: str, make_backend: Callable[..., Any]
) -> None:
    backend = make_backend(storage_config(server_url), host_pool())
    assert isinstance(backend, LMCacheHiCacheStorage)
    assert backend.settings.url == server_url


@pytest.mark.parametrize("layout", LAYOUTS)
def test_v1_round_trip_is_bit_exact_between_two_instances(
    server_url: str, make_backend: Callable[..., Any], layout: str
) -> None:
    """One instance backs its pages up; another (its own pools) loads them."""
    writer_pool, reader_pool = host_pool(layout), host_pool(layout)
    writer = make_backend(storage_config(server_url), writer_pool)
    reader = make_backend(storage_config(server_url), reader_pool)
    keys = keys_for(layout, 5)
    src = fill_pages(writer_pool, len(keys))
    assert writer.batch_set_v1(keys, src) == [True] * len(keys)
    assert reader.batch_exists(keys) == len(keys)
    dst = reader_pool.alloc(len(keys) * PAGE_SIZE)
    assert reader.batch_get_v1(keys, dst) == [True] * len(keys)
    for page in range(len(keys)):
        assert page_bytes(reader_pool, dst, page) == page_bytes(writer_pool, src, page)


def test_batch_exists_counts_the_longest_stored_prefix(
    server_url: str, make_backend: Callable[..., Any]
) -> None:
    pool = host_pool()
    backend = make_backend(storage_config(server_url), pool)
    keys = keys_for("prefix", 6)
    src = fill_pages(pool, 6)
    stored = [0, 1, 2, 4]  # page 3 is missing
    picked = torch.cat([src[p * PAGE_SIZE : (p + 1) * PAGE_SIZE] for p in stored])
    assert backend.batch_set_v1([keys[p] for p in stored], picked) == [True] * 4
    assert backend.batch_exists(keys) == 3
    assert backend.batch_exists(keys[4:]) == 1
    assert backend.batch_exists(keys[3:]) == 0
    assert backend.exists(keys[4]) and not backend.exists(keys[3])
    # A load reports each page; SGLang keeps the leading run of successes.
    dst = pool.alloc(6 * PAGE_SIZE)
    assert backend.batch_get_v1(keys, dst) == [True, True, True, False, True, False]


def test_v1_refuses_a_wrong_number_of_host_indices(
    server_url: str, make_backend: Callable[..., Any]
) -> None:
    pool = host_pool()
    backend = make_backend(storage_config(server_url), pool)
    keys = keys_for("short", 2)
    indices = fill_pages(pool, 2)
    assert backend.batch_set_v1(keys, indices[:-1]) == [False, False]
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, indices[:-1]) == [False, False]


def test_pages_of_another_format_are_never_loaded(
    server_url: str, make_backend: Callable[..., Any]
) -> None:
    """A page's bytes depend on the host layout and dtype: another format is a miss."""
    pool = host_pool("layer_first")
    writer = make_backend(storage_config(server_url), pool)
    keys = keys_for("format", 2)
    assert all(writer.batch_set_v1(keys, fill_pages(pool, 2)))
    for layout, dtype in (("page_first", torch.bfloat16), ("layer_first", torch.float16)):
        other = make_backend(storage_config(server_url), host_pool(layout, dtype))
        assert other.batch_exists(keys) == 0


def test_ranks_and_tenants_are_isolated(server_url: str, make_backend: Callable[..., Any]) -> None:
    pools = [host_pool() for _ in range(4)]
    rank0 = make_backend(storage_config(server_url, tp_rank=0, tp_size=2), pools[0])
    rank1 = make_backend(storage_config(server_url, tp_rank=1, tp_size=2), pools[1])
    tenant = make_backend(
        storage_config(server_url, tp_rank=0, tp_size=2, cache_salt="tenant-b"), pools[2]
    )
    keys = keys_for("rank", 3)
    src0, src1 = fill_pages(pools[0], 3), fill_pages(pools[1], 3)
    assert all(rank0.batch_set_v1(keys, src0))
    assert rank1.batch_exists(keys) == 0 and tenant.batch_exists(keys) == 0
    # The same page names, other bytes, per rank: each rank loads its own.
    assert all(rank1.batch_set_v1(keys, src1))
    dst0, dst1 = pools[0].alloc(3 * PAGE_SIZE), pools[1].alloc(3 * PAGE_SIZE)
    assert all(rank0.batch_get_v1(keys, dst0)) and all(rank1.batch_get_v1(keys, dst1))
    for page in range(3):
        assert page_bytes(pools[0], dst0, page) == page_bytes(pools[0], src0, page)
        assert page_bytes(pools[1], dst1, page) == page_bytes(pools[1], src1, page)
    assert page_bytes(pools[0], dst0, 0) != page_bytes(pools[1], dst1, 0)
    # MLA pages are the same on every TP rank: rank 1 reads what rank 0 wrote.
    mla0 = make_backend(storage_config(server_url, tp_rank=0, tp_size=2, mla=True), pools[3])
    mla1 = make_backend(storage_config(server_url, tp_rank=1, tp_size=2, mla=True), host_pool())
    mla_keys = keys_for("mla", 2)
    assert all(mla0.batch_set_v1(mla_keys, fill_pages(pools[3], 2)))
    assert mla1.batch_exists(mla_keys) == 2


def test_v2_pool_transfers_and_hit_policies(
    server_url: str, make_backend: Callable[..., Any]
) -> None:
    """A KV pool plus an extra pool: ``all_pages`` needs every page of the prefix,
    ``trailing_pages`` the last ones only."""
    kv, extra = host_pool(), host_pool()
    backend = make_backend(storage_config(server_url), kv)
    backend.register_mem_host_pool_v2(kv, PoolName.KV)
    backend.register_mem_host_pool_v2(extra, PoolName.SWA)
    keys = keys_for("v2", 4)
    kv_src, extra_src = fill_pages(kv, 4), fill_pages(extra, 4)
    # The extra pool stores pages 0, 1 and 3 (page 2 is missing).
    extra_pages = [0, 1, 3]
    extra_idx = torch.cat([extra_src[p * PAGE_SIZE : (p + 1) * PAGE_SIZE] for p in extra_pages])
    written = backend.batch_set_v2(
        [
            PoolTransfer(name=PoolName.KV, host_indices=kv_src, keys=keys),
            PoolTransfer(
                name=PoolName.SWA, host_indices=extra_idx, keys=[keys[p] for p in extra_pages]
            ),
        ]
    )
    assert written == {PoolName.KV: [True] * 4, PoolName.SWA: [True] * 3}

    all_pages = PoolTransfer(name=PoolName.SWA, hit_policy=PoolHitPolicy.ALL_PAGES)
    result = backend.batch_exists_v2(keys, [all_pages])
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (2, [1, 2])
    trailing = PoolTransfer(name=PoolName.SWA, keys=["w"], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    result = backend.batch_exists_v2(keys, [trailing])
    assert (result.kv_hit_pages, result.restorable_prefix_pages) == (4, [1, 2, 4])
    assert result.extra_pool_hit_pages == {PoolName.KV: 4, PoolName.SWA: 4}
    assert backend.batch_exists_v2(keys).kv_hit_pages == 4

    kv_dst, extra_dst = kv.alloc(4 * PAGE_SIZE), extra.alloc(2 * PAGE_SIZE)
    loaded = backend.batch_get_v2(
        [
            PoolTransfer(name=PoolName.KV, host_indices=kv_dst, keys=keys),
            PoolTransfer(name=PoolName.SWA, host_indices=extra_dst, keys=[keys[1], keys[2]]),
        ]
    )
    assert loaded == {PoolName.KV: [True] * 4, PoolName.SWA: [True, False]}
    for page in range(4):
        assert page_bytes(kv, kv_dst, page) == page_bytes(kv, kv_src, page)
    assert page_bytes(extra, extra_dst, 0) == page_bytes(extra, extra_src, 1)


def test_a_hybrid_models_pool_group_registers_its_pools_one_by_one(
    server_url: str, make_backend: Callable[..., Any]
) -> None:
    """A hybrid model registers a ``HostPoolGroup`` (no flat-page API) as its host pool,
    then each pool through the v2 registration; the KV pool serves the v1 methods."""
    kv = host_pool()
    group = HostPoolGroup(
        [PoolEntry(PoolName.KV, kv, None, lambda layer: layer, is_primary_index_anchor=True)]
    )
    backend = make_backend(storage_config(server_url), group)
    backend.register_mem_host_pool_v2(kv, PoolName.KV)
    keys = keys_for("group", 2)
    assert backend.batch_set_v1(keys, fill_pages(kv, 2)) == [True, True]
    assert backend.batch_exists(keys) == 2


def test_a_refused_request_is_a_miss_without_backing_off(
    server_url: str, make_backend: Callable[..., Any]
) -> None:
    """A request the server refuses (an object above its request limit) is a miss, and
    the next request goes out at once (the server is there)."""
    pool = host_pool()
    backend = make_backend(storage_config(server_url), pool)
    huge = torch.zeros(200 * 1024 * 1024, dtype=torch.uint8)  # above --max-message-mb
    assert not backend.set(keys_for("huge", 1)[0], huge)
    keys = keys_for("after", 1)
    assert backend.batch_set_v1(keys, fill_pages(pool, 1)) == [True]


def test_the_legacy_tensor_methods(server_url: str, make_backend: Callable[..., Any]) -> None:
    pool = host_pool("layer_first")
    backend = make_backend(storage_config(server_url), pool)
    keys = keys_for("legacy", 3)
    src = fill_pages(pool, 3)
    pages = [pool.get_data_page(int(src[p * PAGE_SIZE]), flat=True) for p in range(3)]
    assert backend.set(keys[0], pages[0])
    assert backend.batch_set(keys[1:], pages[1:])
    assert backend.exists(keys[2]) and backend.batch_exists(keys) == 3
    # SGLang's generic path: get into a dummy page, then copy it into the pool.
    target = pool.get_dummy_flat_data_page()
    assert backend.get(keys[1], target) is target
    assert torch.equal(target.view(torch.uint8), pages[1].view(torch.uint8))
    fresh = backend.batch_get([*keys, "absent"])
    assert fresh[-1] is None
    for got, want in zip(fresh[:3], pages):
        assert got is not None and got.dtype == want.dtype
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    # A target of the wrong size is never written.
    small = torch.zeros(3, dtype=torch.bfloat16)
    assert backend.get(keys[0], small) is None and not small.any()
    assert not backend.batch_set(keys, pages[:1])
    backend.clear()  # leaves the server's objects in place (its eviction manages space)
    assert backend.batch_exists(keys) == 3


def test_random_failures_of_sglangs_injector_never_corrupt_a_load(
    server_url: str, make_backend: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE`` wraps the backend in SGLang's
    injector: calls fail at random; every load that reports success is bit-exact."""
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.3")
    writer_pool, reader_pool = host_pool(), host_pool()
    writer = make_backend(storage_config(server_url), writer_pool)
    reader = make_backend(storage_config(server_url), reader_pool)
    assert isinstance(writer, HiCacheStorageFailureInjector)
    outcomes: dict[str, int] = {"stored": 0, "store_failed": 0, "loaded": 0, "load_failed": 0}
    for round_ in range(40):
        keys = keys_for(f"inject{round_}", 2)
        src = fill_pages(writer_pool, 2)
        stored = all(writer.batch_set_v1(keys, src))
        outcomes["stored" if stored else "store_failed"] += 1
        hits = reader.batch_exists(keys)
        assert hits in (0, 2) if stored else hits == 0
        dst = reader_pool.alloc(2 * PAGE_SIZE)
        results = reader.batch_get_v1(keys, dst)
        for page, ok in enumerate(results):
            if ok:
                assert page_bytes(reader_pool, dst, page) == page_bytes(writer_pool, src, page)
        outcomes["loaded" if all(results) else "load_failed"] += 1
        writer_pool.free(src)
        reader_pool.free(dst)
    assert all(outcomes.values()), outcomes


def test_a_dead_server_costs_misses_within_a_bound_never_an_exception(
    servers: Servers, make_backend: Callable[..., Any]
) -> None:
    url = servers.start()
    pool = host_pool()
    config = storage_config(url, timeout_s=1.0, retry_after_s=2.0)
    backend = make_backend(config, pool)
    keys = keys_for("down", 2)
    src = fill_pages(pool, 2)
    assert all(backend.batch_set_v1(keys, src))
    servers.kill(url)

    dst = pool.alloc(2 * PAGE_SIZE)
    calls: list[Callable[[], Any]] = [
        lambda: backend.batch_exists(keys),
        lambda: backend.batch_get_v1(keys, dst),
        lambda: backend.batch_set_v1(keys_for("down-new", 2), src),
        lambda: backend.get(keys[0]),
        lambda: backend.set(keys[0], pool.get_dummy_flat_data_page()),
    ]
    expected = [0, [False, False], [False, False], None, False]
    for call, want in zip(calls, expected):
        start = time.monotonic()
        assert call() == want
        assert time.monotonic() - start < 2.5  # one timeout (1 s) at most, with slack
    assert backend.batch_exists_v2(keys).kv_hit_pages == 0
    # Within the back-off window nothing waits for the network.
    start = time.monotonic()
    assert backend.batch_exists(keys) == 0
    assert time.monotonic() - start < 0.5

    # A server that comes back is used again once the window is over (empty: it was
    # killed, so its L1 is gone).
    servers.start(url)
    time.sleep(2.1)
    assert backend.batch_exists(keys) == 0
    assert all(backend.batch_set_v1(keys, src))
    assert backend.batch_exists(keys) == 2


def test_a_page_sent_while_the_server_was_down_is_never_stored_later(
    servers: Servers, make_backend: Callable[..., Any]
) -> None:
    """Pages go out zero-copy, viewing the host pool: a request still queued in the
    socket when its wait ended must be dropped, or a server that comes back would store
    whatever SGLang has put in that host slot since, under the old page's name."""
    url = servers.start()
    pool = host_pool()
    backend = make_backend(storage_config(url, timeout_s=0.5, retry_after_s=0.0), pool)
    assert backend.batch_exists(["warm-up"]) == 0  # connected
    servers.kill(url)
    keys = keys_for("late", 2)
    assert backend.batch_set_v1(keys, fill_pages(pool, 2)) == [False, False]
    servers.start(url)
    probe = MPClient(url, timeout=5)
    try:
        scope = backend._pools["kv"].scope
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert probe.count_object_prefix(scope, keys) == 0
            time.sleep(0.2)
    finally:
        probe.close()


def test_no_server_at_start_is_not_an_error(make_backend: Callable[..., Any]) -> None:
    """SGLang starts even when nothing listens yet: every call is a miss."""
    backend = make_backend(storage_config(free_url(), timeout_s=0.5), host_pool())
    start = time.monotonic()
    assert backend.batch_exists(["k"]) == 0
    assert backend.get("k") is None
    assert time.monotonic() - start < 2.0


def test_bad_settings_are_refused_by_name() -> None:
    config = storage_config("tcp://127.0.0.1:1", timeout_s=0)
    with pytest.raises(ValueError, match="timeout_s"):
        StorageBackendFactory.create_backend("dynamic", config, None)


def _documented_extra_config() -> tuple[dict[str, Any], str]:
    """The extra config of the docs' launch command, and the page's text."""
    docs = Path(__file__).resolve().parents[3] / "docs"
    for name in ("sglang.md", "sglang-hicache.md"):
        text = (docs / name).read_text() if (docs / name).exists() else ""
        found = re.search(r"--hicache-storage-backend-extra-config '([^']+)'", text)
        if found:
            return json.loads(found.group(1)), text
    raise AssertionError("no --hicache-storage-backend-extra-config in docs/sglang*.md")


def test_the_documented_extra_config_works_as_documented(
    server_url: str, make_backend: Callable[..., Any]
) -> None:
    extra, text = _documented_extra_config()
    assert extra["module_path"] == MODULE and extra["interface_v1"] == 1
    for key in CONFIG_KEYS:
        assert f"`{key}`" in text, f"extra-config key {key} is not documented"
    config = storage_config(server_url)
    config.extra_config = {**extra, "lmcache_url": server_url}
    pool = host_pool()
    backend = make_backend(config, pool)
    keys = keys_for("docs", 1)
    assert backend.batch_set_v1(keys, fill_pages(pool, 1)) == [True]
    assert backend.batch_exists(keys) == 1
