"""``--l2-adapter`` types served through the L2 adapter interface, in a real ``lmcache
server`` process: a third party's adapter loaded by ``"type": "plugin"`` serves chunks
evicted from L1 bit for bit, and ``fault_inject`` read failures in L2 are misses -- the
engine sees no error and the server keeps serving."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from mp_server_helpers import CHUNK_SIZE, ServerProcess, free_port, make_kv, unlink_kv

THIRD_PARTY = Path(__file__).resolve().parents[2] / "storage_backend" / "third_party_adapter"
# ~200 KiB of L1: room for about 60 chunks of this layout, so a flood of other prefixes
# evicts the first one from L1 (the adapter keeps every chunk).
TINY_L1 = ["--chunk-size", str(CHUNK_SIZE), "--l1-size-gb", "0.0002", "--max-workers", "2"]
TOKENS = list(range(11, 11 + 3 * CHUNK_SIZE))
BLOCKS = list(range(len(TOKENS) // 4))
FLOOD_PREFIXES = 40


def _plugin_spec(stats: Path) -> dict[str, Any]:
    return {
        "type": "plugin",
        "module_path": "bytes_l2_adapter",
        "class_name": "BytesL2Adapter",
        "adapter_params": {"stats_path": str(stats)},
    }


def _stats(path: Path) -> dict[str, int]:
    return json.loads(path.read_text()) if path.exists() else {}


def _wait_for(predicate: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def third_party_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [str(THIRD_PARTY), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


class _Engine:
    """One worker over its own KV cache; ``expected`` is what TOKENS stored."""

    def __init__(self, server: ServerProcess) -> None:
        from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

        self.kv = make_kv(seed=7)
        self.expected = [layer[:, BLOCKS].clone() for layer in self.kv]
        self.worker = KVCacheWorker(
            self.kv,
            model_name=f"tp-{uuid.uuid4().hex[:8]}",
            server_url=server.url,
            mode="engine_driven",
            sub_path="shm",
        )

    def flood_l1(self, stats: Path, http_port: int) -> None:
        """Store other prefixes until the first one's chunks are out of L1, then wait until
        the adapter holds them all and the server has taken the stores as done: chunks
        still queued for the adapter keep their L1 memory (under load that can leave no
        room to read a chunk back: a miss without a load)."""
        for i in range(FLOOD_PREFIXES):
            start = 10_000 + i * len(TOKENS)
            assert self.worker.store(list(range(start, start + len(TOKENS))), BLOCKS)
        every_chunk = (FLOOD_PREFIXES + 1) * len(TOKENS) // CHUNK_SIZE
        # The tier counts a chunk once the adapter signalled its store done (after counting it).
        done = _wait_for(lambda: _adapter_tier(http_port)["objects"] >= every_chunk)
        assert done, (_adapter_tier(http_port), _stats(stats))

    def retrieve_is_bit_exact(self) -> bool:
        for layer in self.kv:
            layer.zero_()
        if not self.worker.retrieve(TOKENS, BLOCKS):
            return False
        return all(torch.equal(layer[:, BLOCKS], e) for layer, e in zip(self.kv, self.expected))

    def close(self) -> None:
        self.worker.close()
        unlink_kv(self.kv)


def _start(tmp_path: Path, spec: dict[str, Any], http_port: int, *extra: str) -> ServerProcess:
    args = [*TINY_L1, "--l2-adapter", json.dumps(spec), "--http-port", str(http_port), *extra]
    server = ServerProcess(args, tmp_path / "server.log")
    server.wait_ready()
    return server


def _adapter_tier(http_port: int) -> dict[str, Any]:
    """The adapter tier's entry in ``/status`` (``objects``: chunks whose store finished)."""
    tiers = httpx.get(f"http://127.0.0.1:{http_port}/status", timeout=10).json()["tiers"]
    return next(t for t in tiers if t["kind"] == "remote")  # type: ignore[no-any-return]


def _l1_used_after_clear(http_port: int) -> int:
    """Clear every cached object over HTTP, then L1's used bytes per ``/status``: what is
    left is memory nobody can reach (a leaked buffer)."""
    base = f"http://127.0.0.1:{http_port}"
    assert httpx.post(f"{base}/cache/clear", json={"force": True}, timeout=10).status_code == 200
    tiers = httpx.get(f"{base}/status", timeout=10).json()["tiers"]
    return int(next(t for t in tiers if t["name"] == "LocalCPUBackend")["used_bytes"])


@pytest.mark.usefixtures("third_party_on_path")
def test_third_party_adapter_serves_chunks_evicted_from_l1(tmp_path: Path) -> None:
    stats = tmp_path / "adapter-stats.json"
    http_port = free_port()
    server = _start(tmp_path, _plugin_spec(stats), http_port)
    engine = _Engine(server)
    try:
        assert engine.worker.store(TOKENS, BLOCKS)
        assert _wait_for(lambda: _stats(stats).get("stored", 0) >= 3), server.log()
        engine.flood_l1(stats, http_port)
        loaded_before = _stats(stats).get("loaded", 0)
        assert engine.worker.lookup(TOKENS) == len(TOKENS)
        assert engine.retrieve_is_bit_exact()
        # The chunks came back through the adapter (from outside the server process).
        assert _stats(stats)["loaded"] - loaded_before >= 3, _stats(stats)
    finally:
        engine.close()
        assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log_path.read_text()


@pytest.mark.usefixtures("third_party_on_path")
def test_fault_injected_l2_reads_are_misses_not_errors(tmp_path: Path) -> None:
    stats = tmp_path / "adapter-stats.json"
    spec = {"type": "fault_inject", "rate": 1.0, "seed": 3, "inner": _plugin_spec(stats)}
    http_port = free_port()
    server = _start(tmp_path, spec, http_port, "--enable-http-cache-clear")
    engine = _Engine(server)
    try:
        assert engine.worker.store(TOKENS, BLOCKS)
        assert _wait_for(lambda: _stats(stats).get("stored", 0) >= 3), server.log()
        engine.flood_l1(stats, http_port)
        # Every L2 load fails: a miss, reported as one, with no error to the engine.
        assert not engine.retrieve_is_bit_exact()
        assert _stats(stats).get("loaded", 0) >= 1  # the adapter did serve; the faults hid it
        # The server keeps serving: a fresh prefix round-trips from L1.
        fresh = list(range(500_000, 500_000 + len(TOKENS)))
        assert engine.worker.store(fresh, BLOCKS)
        assert engine.worker.retrieve(fresh, BLOCKS)
        assert server.proc.poll() is None
        # No L1 buffer stayed behind for the failed L2 reads.
        assert _l1_used_after_clear(http_port) == 0
    finally:
        engine.close()
        assert server.stop() == 0, server.log()
    log = server.log_path.read_text()
    assert "Traceback" not in log
    assert "fault injection ACTIVE" in log


def test_status_reports_an_adapter_tier() -> None:
    from lmcache.v1.multiprocess.server.tiers import (
        describe_tiers,
        install_eviction_counters,
        tier_degradations,
        tier_problems,
    )
    from lmcache.v1.storage_backend.l2_adapters.mock_l2_adapter import MockL2Adapter
    from lmcache.v1.storage_backend.storage_manager import StorageManager, create_storage_backends
    from lmcache.v1.storage_backend.tier_settings import TierSettings

    spec = {
        "type": "mock",
        "max_size_gb": 0.01,
        "mock_bandwidth_gb": 10,
        "eviction": {"eviction_policy": "LRU"},
    }
    settings = TierSettings.from_server_flags(
        chunk_size=16,
        l1_size_gb=0.001,
        eviction_policy="LRU",
        blocking_timeout_secs=1,
        l2_adapters=[json.dumps(spec)],
    )
    storage = StorageManager(settings.config, backends=create_storage_backends(settings))
    try:
        tiers = {t["name"]: t for t in describe_tiers(storage, install_eviction_counters(storage))}
        tier = tiers["L2Adapter0:mock"]
        assert tier["kind"] == "remote" and tier["evictions"] == 0
        assert tier["capacity_bytes"] == int(0.01 * 1024**3)
        assert tier["objects"] == 0 and tier["errors"] == 0
        assert not tier_problems(storage) and not tier_degradations(storage)
        adapter = storage.storage_backends["L2Adapter0:mock"].adapter  # type: ignore[attr-defined]
        assert isinstance(adapter, MockL2Adapter)
        adapter.report_status = lambda: {"is_healthy": False, "error": "disk gone"}  # type: ignore[method-assign]
        assert tier_degradations(storage) == [
            "L2Adapter0:mock: the adapter reports itself unhealthy (disk gone)"
        ]
    finally:
        storage.close()
