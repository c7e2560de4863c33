"""The HTTP frontend and the metrics of a real ``lmcache server`` process, over real HTTP."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from mp_server_helpers import CHUNK_SIZE, ServerProcess, free_port, make_kv, unlink_kv
from prometheus_client.parser import text_string_to_metric_families
from small_tmpfs import SmallTmpfs

from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
# A tiny L1 (~100 chunks of the small test layout) so a few stores evict.
TINY_L1_GB = "0.0003"


class HttpServer:
    def __init__(self, server: ServerProcess, http_port: int, prom_port: int) -> None:
        self.server = server
        self.base = f"http://127.0.0.1:{http_port}"
        self.prom = f"http://127.0.0.1:{prom_port}" if prom_port else ""
        self.http = httpx.Client(base_url=self.base, timeout=10)

    def scrape(self, base: str | None = None) -> Samples:
        response = httpx.get(f"{base or self.base}/metrics", timeout=10)
        assert response.status_code == 200, response.text
        samples: Samples = {}
        for family in text_string_to_metric_families(response.text):
            for s in family.samples:
                samples[(s.name, frozenset(s.labels.items()))] = s.value
        return samples


def _start(factory: Callable[..., ServerProcess], *args: str, prom: bool = True) -> HttpServer:
    http_port, prom_port = free_port(), free_port() if prom else 0
    server = factory(
        "--http-port", str(http_port), "--prometheus-port", str(prom_port), *args
    )  # fmt: skip
    hs = HttpServer(server, http_port, prom_port)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the frontend starts right after the MP socket
        try:
            hs.http.get("/")
            return hs
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"HTTP frontend did not come up:\n{server.log()}")


@pytest.fixture(scope="module")
def metered(server_factory: Callable[..., ServerProcess]) -> HttpServer:
    return _start(
        server_factory,
        "--supported-transfer-mode", "auto", "--l1-size-gb", TINY_L1_GB,
        "--enable-http-cache-clear",
    )  # fmt: skip


@pytest.fixture(scope="module")
def disk_server(
    server_factory: Callable[..., ServerProcess], tmp_path_factory: pytest.TempPathFactory
) -> tuple[HttpServer, Path]:
    disk = tmp_path_factory.mktemp("disk-tier") / "cache"
    hs = _start(
        server_factory,
        "--supported-transfer-mode", "engine_driven", "--l2-disk-path", str(disk),
        "--l2-disk-size-gb", "0.01", prom=False,
    )  # fmt: skip
    return hs, disk


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_every_route_answers(metered: HttpServer) -> None:
    index = metered.http.get("/")
    assert index.status_code == 200
    assert set(index.json()["routes"]) >= {"/healthcheck", "/status", "/metrics", "/cache/clear"}
    health = metered.http.get("/healthcheck")
    assert health.status_code == 200 and health.json() == {"status": "healthy"}
    status = metered.http.get("/status").json()
    assert status["chunk_size"] == CHUNK_SIZE
    assert status["version"] and status["uptime_seconds"] >= 0
    assert status["transfer_modes"] == ["lmcache_driven", "engine_driven"]
    assert status["healthy"] and status["metrics_enabled"]
    (l1,) = status["tiers"]
    assert l1["kind"] == "l1" and l1["capacity_bytes"] > 0
    metrics = metered.http.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "lmcache_mp_tier_capacity_bytes" in metrics.text
    # The same registry on --prometheus-port.
    assert "lmcache_mp_tier_capacity_bytes" in httpx.get(f"{metered.prom}/metrics").text
    cleared = metered.http.post("/cache/clear")
    assert cleared.status_code == 200 and cleared.json()["status"] == "ok"


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        ("GET", "/no/such/route", {}, 404, "not_found"),
        ("POST", "/healthcheck", {}, 405, "method_not_allowed"),
        ("GET", "/cache/clear", {}, 405, "method_not_allowed"),
        ("POST", "/cache/clear?force=maybe", {}, 422, "bad_request"),
        ("POST", "/cache/clear", {"content": b"{not json"}, 400, "bad_request"),
        ("POST", "/cache/clear", {"json": {"force": True, "all": 1}}, 400, "bad_request"),
        ("POST", "/cache/clear", {"json": {"force": "yes"}}, 400, "bad_request"),
    ],
)
def test_bad_requests_get_json_4xx(
    metered: HttpServer, method: str, path: str, kwargs: dict[str, object], status: int, code: str
) -> None:
    response = metered.http.request(method, path, **kwargs)  # type: ignore[arg-type]
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code and body["message"]


def test_metrics_follow_store_hit_miss_eviction(metered: HttpServer) -> None:
    model = f"metrics-{uuid.uuid4().hex[:8]}"
    kv = make_kv(seed=3)
    worker = KVCacheWorker(
        kv, model_name=model, server_url=metered.server.url, mode="engine_driven", sub_path="shm"
    )
    try:
        chunk_bytes = worker.context.layout.bytes_per_token() * CHUNK_SIZE  # type: ignore[union-attr]
        tokens = list(range(1, 1 + 4 * CHUNK_SIZE))
        ids = list(range(4 * CHUNK_SIZE // 4))
        before = metered.scrape()
        assert _value(before, "lmcache_mp_registered_workers", mode="engine_driven") == 1

        assert worker.lookup(tokens) == 0  # miss
        after_miss = metered.scrape()
        miss = "lmcache_mp_lookup_tokens_total"
        assert _value(after_miss, miss, result="miss") - _value(before, miss, result="miss") == len(
            tokens
        )

        assert worker.store(tokens, ids)  # store
        after_store = metered.scrape()
        stored = "lmcache_mp_stored_bytes_total"
        labels = {"transfer_mode": "engine_driven", "sub_path": "shm"}
        assert _value(after_store, stored, **labels) - _value(before, stored, **labels) == (
            4 * chunk_bytes
        )
        ok = {"operation": "commit_store", "outcome": "ok"}
        assert _value(after_store, "lmcache_mp_requests_total", **ok) >= 1
        assert (
            _value(
                after_store, "lmcache_mp_request_latency_seconds_count", operation="commit_store"
            )
            >= 1
        )
        used = "lmcache_mp_tier_used_bytes"
        l1 = {"tier": "LocalCPUBackend", "kind": "l1"}
        assert _value(after_store, used, **l1) > _value(after_miss, used, **l1)

        rid = uuid.uuid4().hex
        assert worker.lookup(tokens, keep_locks=True, request_id=rid) == len(tokens)  # hit
        after_hit = metered.scrape()
        hit = "lmcache_mp_lookup_tokens_total"
        assert _value(after_hit, hit, result="hit") - _value(after_store, hit, result="hit") == len(
            tokens
        )
        assert _value(after_hit, "lmcache_mp_pinned_objects") == 4
        assert 0 < _value(after_hit, "lmcache_mp_lookup_hit_rate") < 1
        worker.end_session(rid)
        assert _value(metered.scrape(), "lmcache_mp_pinned_objects") == 0

        assert worker.retrieve(tokens, ids)
        retrieved = "lmcache_mp_retrieved_bytes_total"
        assert (
            _value(metered.scrape(), retrieved, **labels) - _value(after_hit, retrieved, **labels)
            == 4 * chunk_bytes
        )

        evicted = "lmcache_mp_evictions_total"
        capacity = _value(after_store, "lmcache_mp_tier_capacity_bytes", **l1)
        rounds = int(capacity // (4 * chunk_bytes)) + 2
        for i in range(rounds):  # more than L1 holds: the oldest chunks go
            base = (i + 2) * 1_000_000
            assert worker.store(list(range(base, base + 4 * CHUNK_SIZE)), ids)
        final = metered.scrape()
        assert _value(final, evicted, tier="LocalCPUBackend") > 0
        assert worker.lookup(tokens) == 0  # the first store was evicted
    finally:
        worker.close()
        unlink_kv(kv)


def test_healthcheck_fails_when_the_disk_tier_is_broken(
    disk_server: tuple[HttpServer, Path],
) -> None:
    hs, disk = disk_server
    assert hs.http.get("/healthcheck").status_code == 200
    status = hs.http.get("/status").json()
    assert [t["kind"] for t in status["tiers"]] == ["l1", "disk"]
    errors_before = _value(hs.scrape(), "lmcache_mp_tier_errors_total", tier="LocalDiskBackend")

    shutil.rmtree(disk)  # the disk tier's directory disappears under the server
    health = hs.http.get("/healthcheck")
    assert health.status_code == 503
    body = health.json()
    assert body["status"] == "unhealthy"
    assert any("LocalDiskBackend" in p for p in body["problems"])
    assert hs.http.get("/status").json()["healthy"] is False
    assert _value(hs.scrape(), "lmcache_mp_healthy") == 0

    # Write-through to the missing directory fails: counted as disk tier errors.
    kv = make_kv(seed=5)
    worker = KVCacheWorker(
        kv, model_name=f"disk-{uuid.uuid4().hex[:8]}", server_url=hs.server.url,
        mode="engine_driven", sub_path="shm",
    )  # fmt: skip
    try:
        assert worker.store(list(range(5, 5 + 2 * CHUNK_SIZE)), list(range(8)))
        deadline = time.monotonic() + 10
        errors = errors_before
        while errors == errors_before and time.monotonic() < deadline:
            time.sleep(0.1)
            errors = _value(hs.scrape(), "lmcache_mp_tier_errors_total", tier="LocalDiskBackend")
        assert errors > errors_before
    finally:
        worker.close()
        unlink_kv(kv)

    disk.mkdir(parents=True)  # repaired: healthy again
    assert hs.http.get("/healthcheck").status_code == 200


def test_disabled_metrics_and_clear_and_clean_shutdown(
    server_factory: Callable[..., ServerProcess],
) -> None:
    hs = _start(server_factory, "--disable-metrics")
    assert hs.http.get("/healthcheck").status_code == 200
    assert hs.http.get("/status").json()["metrics_enabled"] is False
    metrics = hs.http.get("/metrics")
    assert metrics.status_code == 404 and metrics.json()["error"] == "metrics_disabled"
    with pytest.raises(httpx.TransportError):  # no Prometheus endpoint without metrics
        httpx.get(f"{hs.prom}/metrics", timeout=2)
    clear = hs.http.post("/cache/clear")
    assert clear.status_code == 403 and clear.json()["error"] == "forbidden"
    assert hs.server.stop() == 0
    with pytest.raises(httpx.TransportError):  # the frontend went with the server
        httpx.get(f"{hs.base}/healthcheck", timeout=2)


def test_instance_id_is_reported(server_factory: Callable[..., ServerProcess]) -> None:
    named = _start(server_factory, "--instance-id", "cache-a", prom=False)
    assert named.http.get("/status").json()["instance_id"] == "cache-a"
    assert "LMCache server cache-a listening on" in named.server.log()
    unnamed = _start(server_factory, prom=False)
    generated = unnamed.http.get("/status").json()["instance_id"]
    assert len(generated) == 32 and int(generated, 16) >= 0  # a uuid4 hex, fixed per run
    assert f"LMCache server {generated} listening on" in unnamed.server.log()


def test_config_routes_report_the_running_server(disk_server: tuple[HttpServer, Path]) -> None:
    hs, disk = disk_server
    config = hs.http.get("/config")
    assert config.status_code == 200
    assert config.text.startswith("{\n  ")  # indented for people to read
    document = config.json()
    assert document["mp"]["l2_disk_path"] == str(disk)
    assert document["mp"]["supported_transfer_mode"] == "engine_driven"
    assert document["server"]["chunk_size"] == CHUNK_SIZE
    (adapter,) = hs.http.get("/config/adapters").json()["adapters"]
    assert adapter["index"] == 0 and adapter["primary"] and not adapter["reconfigurable"]
    assert adapter["type_name"] == "disk"


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_healthcheck_is_unhealthy_while_disk_writes_fail_with_enospc(
    server_factory: Callable[..., ServerProcess], small_tmpfs: Callable[[int], SmallTmpfs]
) -> None:
    """A disk tier whose file system has room for the old 2-byte probe but not for a
    chunk: every write fails with ENOSPC and /healthcheck says so (it said healthy before);
    with room again the server is healthy without another store."""
    fs = small_tmpfs(1 << 20)
    hs = _start(
        server_factory,
        "--supported-transfer-mode", "engine_driven", "--l2-disk-path", str(fs.path / "l2"),
        "--l2-disk-size-gb", "0.01", prom=False,
    )  # fmt: skip
    kv = make_kv(seed=9, num_heads=4, head_size=64)  # 48 KiB chunks: more than a page
    worker = KVCacheWorker(
        kv, model_name=f"enospc-{uuid.uuid4().hex[:8]}", server_url=hs.server.url,
        mode="engine_driven", sub_path="shm",
    )  # fmt: skip

    def disk_tier() -> dict[str, Any]:
        tiers = hs.http.get("/status").json()["tiers"]
        return next(t for t in tiers if t["kind"] == "disk")

    try:
        assert worker.store(list(range(CHUNK_SIZE)), list(range(4)))  # one chunk lands
        assert _wait_for(lambda: disk_tier()["objects"] == 1)
        chunk = disk_tier()["used_bytes"]
        assert hs.http.get("/healthcheck").json() == {"status": "healthy"}
        filler = fs.fill(leave_bytes=chunk // 2)
        assert fs.free_bytes() > 2  # the old probe's two bytes still fit
        for i in range(1, 4):  # three more chunks, each write fails with ENOSPC
            tokens = list(range(1000 * i, 1000 * i + CHUNK_SIZE))
            assert worker.store(tokens, list(range(4 * i, 4 * i + 4)))
        assert _wait_for(lambda: disk_tier()["errors"] >= 3), disk_tier()
        health = hs.http.get("/healthcheck")
        assert health.status_code == 503, health.text
        problems = health.json()["problems"]
        assert any("LocalDiskBackend" in p and "less than one chunk" in p for p in problems)
        assert any("the last 3 writes" in p and "No space left" in p for p in problems)
        log = hs.server.log()
        # Rate-limited: one line for the three failures, no traceback.
        assert log.count("a chunk write failed") == 1 and "Traceback" not in log
        filler.unlink()
        assert hs.http.get("/healthcheck").json() == {"status": "healthy"}
    finally:
        worker.close()
        unlink_kv(kv)
        hs.server.stop()
