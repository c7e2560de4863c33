"""``/quota`` and ``/quota/{cache_salt}`` on the server's HTTP app: upstream's bodies and
answers, the admin token, bad input, and the quotas reaching eviction and the metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from lmcache.utils import CacheEngineKey
from lmcache.v1.multiprocess.server import MPCacheServer
from lmcache.v1.multiprocess.server.http_frontend import ROUTES, build_app
from lmcache.v1.multiprocess.server.metrics import OTHER_SALTS, bounded_salt_usage
from lmcache.v1.multiprocess.server.operator_routes.quota_api import MAX_QUOTA_BODY_BYTES
from lmcache.v1.storage_backend.cache_salt import configs_with_salt

TOKEN = "quota-admin-token-" + "0123456789abcdef"
GIB = 1024**3
SHAPE = torch.Size([2, 2, 16, 32])  # 4 KiB of half


def _bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def engine(make_engine: Callable[..., MPCacheServer]) -> MPCacheServer:
    return make_engine(admin_token=TOKEN)


@pytest.fixture
def client(engine: MPCacheServer) -> TestClient:
    return TestClient(build_app(engine), raise_server_exceptions=False)


def _store(engine: MPCacheServer, i: int, salt: str) -> CacheEngineKey:
    key = CacheEngineKey("m", 1, 0, i, torch.half, configs_with_salt(None, salt))
    cpu = engine.storage.local_cpu_backend
    obj = cpu.allocate(SHAPE, torch.half, busy_loop=False)
    assert obj is not None
    cpu.batched_submit_put_task([key], [obj])
    obj.ref_count_down()
    return key


def test_routes_are_listed() -> None:
    assert "/quota" in ROUTES and "/quota/{cache_salt}" in ROUTES


def test_crud_round_trip_with_upstreams_bodies(engine: MPCacheServer, client: TestClient) -> None:
    put = client.put("/quota/alice", json={"limit_gb": 0.5}, headers=_bearer())
    assert put.status_code == 200
    assert put.json() == {"cache_salt": "alice", "limit_gb": 0.5, "status": "ok"}
    assert engine.storage.quota_manager.get_limit_bytes("alice") == GIB // 2

    _store(engine, 1, "alice")
    got = client.get("/quota/alice", headers=_bearer()).json()
    assert got["cache_salt"] == "alice" and got["exists"] is True
    assert got["limit_gb"] == 0.5 and got["limit_bytes"] == GIB // 2
    assert got["current_usage_bytes"] == 4096
    assert got["current_usage_gb"] == pytest.approx(4096 / GIB)
    assert got["usage_bytes_by_tier"] == {"LocalCPUBackend": 4096}

    milli = client.put("/quota/carol", json={"limit_gb": 0.001}, headers=_bearer()).json()
    assert milli["limit_gb"] == 0.001  # echoed as given, as upstream
    assert engine.storage.quota_manager.get_limit_bytes("carol") == int(0.001 * GIB)
    assert client.put("/quota/bob", json={"limit_bytes": 12345}, headers=_bearer()).json()[
        "limit_gb"
    ] == pytest.approx(12345 / GIB)
    listed = client.get("/quota", headers=_bearer()).json()
    assert set(listed["users"]) == {"alice", "bob", "carol"}
    assert listed["users"]["alice"]["current_usage_gb"] == pytest.approx(4096 / GIB)

    gone = client.delete("/quota/alice", headers=_bearer()).json()
    assert gone == {"cache_salt": "alice", "status": "removed"}
    assert client.delete("/quota/alice", headers=_bearer()).json()["status"] == "not_found"
    after = client.get("/quota/alice", headers=_bearer()).json()
    assert after["exists"] is False and after["limit_gb"] == 0.0  # the allowlist lens


def test_the_empty_salt_is_spelled_default(engine: MPCacheServer, client: TestClient) -> None:
    reply = client.put("/quota/_default", json={"limit_gb": 1}, headers=_bearer())
    assert reply.json()["cache_salt"] == "_default"
    assert engine.storage.quota_manager.get_limit_bytes("") == GIB
    _store(engine, 2, "")
    assert client.get("/quota/_default", headers=_bearer()).json()["current_usage_bytes"] == 4096


@pytest.mark.parametrize(
    ("method", "path"),
    [("get", "/quota"), ("get", "/quota/a"), ("put", "/quota/a"), ("delete", "/quota/a")],
)
@pytest.mark.parametrize("headers", [{}, _bearer("wrong-token-" + "x" * 20)])
def test_every_quota_route_needs_the_admin_token(
    engine: MPCacheServer, client: TestClient, method: str, path: str, headers: dict[str, str]
) -> None:
    reply = client.request(method, path, json={"limit_gb": 1}, headers=headers)
    assert reply.status_code == 401, reply.text
    assert reply.json()["error"] == "unauthorized"
    assert not engine.storage.quota_manager.has_quota("a")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[1]",
        b"{}",
        b'{"limit_gb": "1"}',
        b'{"limit_gb": true}',
        b'{"limit_gb": -1}',
        b'{"limit_gb": 1e999}',
        b'{"limit_gb": NaN}',
        b'{"limit_bytes": 1.5}',
        b'{"limit_bytes": -4}',
        b'{"limit_gb": 1, "limit_bytes": 2}',
        b"[" * 2000 + b"]" * 2000,
    ],
)
def test_bad_bodies_are_400_and_change_nothing(
    engine: MPCacheServer, client: TestClient, body: bytes
) -> None:
    reply = client.put("/quota/a", content=body, headers=_bearer())
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"] == "bad_request" and reply.json()["message"]
    assert not engine.storage.quota_manager.has_quota("a")


def test_oversized_body_and_overlong_salt_are_refused(
    engine: MPCacheServer, client: TestClient
) -> None:
    big = b'{"limit_gb": 1' + b" " * MAX_QUOTA_BODY_BYTES + b"}"
    assert client.put("/quota/a", content=big, headers=_bearer()).status_code == 413
    assert (
        client.put("/quota/" + "s" * 129, json={"limit_gb": 1}, headers=_bearer()).status_code
        == 400
    )
    assert engine.storage.quota_manager.list_quotas() == []


def test_without_an_admin_token_the_routes_are_open(
    make_engine: Callable[..., MPCacheServer],
) -> None:
    client = TestClient(build_app(make_engine()))
    assert client.put("/quota/a", json={"limit_gb": 1}).status_code == 200


def test_a_quota_set_over_http_decides_who_is_evicted(
    make_engine: Callable[..., MPCacheServer],
) -> None:
    engine = make_engine(eviction_policy="IsolatedLRU", l1_size_gb=32 / 1024**2)  # 8 objects
    client = TestClient(build_app(engine))
    client.put("/quota/alice", json={"limit_bytes": 4 * 4096})
    client.put("/quota/bob", json={"limit_bytes": 4096})
    alice = [_store(engine, i, "alice") for i in range(4)]
    for i in range(10, 30):
        _store(engine, i, "bob")
    cpu = engine.storage.local_cpu_backend
    assert all(cpu.contains(key) for key in alice)
    assert cpu.evictions > 0


def _samples(engine: MPCacheServer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    assert engine.metrics is not None
    text = engine.metrics.exposition().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_show_usage_per_salt_with_bounded_labels(
    make_engine: Callable[..., MPCacheServer],
) -> None:
    engine = make_engine(disable_metrics=False)
    engine.storage.quota_manager.set_quota("tenant-0", 10 * 4096)
    for i in range(14):
        _store(engine, i, f"tenant-{i}")
    _store(engine, 99, "tenant-0")
    _store(engine, 100, "")
    samples = _samples(engine)
    used = {
        dict(labels)["cache_salt"]: value
        for (name, labels), value in samples.items()
        if name == "lmcache_mp_tenant_used_bytes"
    }
    assert len(used) == 11  # the ten largest plus "other", whatever the tenant count
    assert used["tenant-0"] == 2 * 4096
    assert sum(used.values()) == 16 * 4096 and used[OTHER_SALTS] > 0
    assert samples[("lmcache_mp_tenants", frozenset({("tier", "LocalCPUBackend")}))] == 15
    quota = ("lmcache_mp_tenant_quota_bytes", frozenset({("cache_salt", "tenant-0")}))
    assert samples[quota] == 10 * 4096


def test_bounded_salt_usage_keeps_the_largest_and_sums_the_rest() -> None:
    usage: dict[str, Any] = {"": 5, "a": 9, "b": 1, "c": 3}
    assert bounded_salt_usage(usage, top=2) == [("a", 9), ("_default", 5), (OTHER_SALTS, 4)]
    assert bounded_salt_usage(usage, top=10)[-1] == ("b", 1)
    assert bounded_salt_usage({}, top=3) == []
