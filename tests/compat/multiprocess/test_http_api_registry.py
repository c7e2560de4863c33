"""Our ``HTTPAPIRegistry`` and ``http_apis`` routes (upstream 0.5.6's API) over an engine
like :class:`~lmcache.v1.multiprocess.server.handler.MPCacheServer`: the health problems,
the ``status()`` fallback and the cache-clear guards that upstream's tests do not cover."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from lmcache.compat.upstream_056.http_api_registry import HTTPAPIRegistry
from lmcache.v1.multiprocess.wire.security import TokenCheck

TOKEN = "s3cret-token-0123456789"


class _Engine:
    """The MPCacheServer methods the routes call."""

    def __init__(self, problems: list[str] | None = None, token: str | None = None) -> None:
        self.problems = problems or []
        self.token = token
        self.cleared: list[bool] = []
        self.refused_at: list[str] = []

    def health_problems(self) -> list[str]:
        return self.problems

    def status(self) -> dict[str, Any]:
        return {"l1": {"chunks": 3}}

    def check_admin_token(self, presented: str | None, where: str) -> TokenCheck:
        if self.token is None or presented == self.token:
            return TokenCheck.OK
        self.refused_at.append(where)
        return TokenCheck.MISSING if presented is None else TokenCheck.WRONG

    def remove_all(self, force: bool = False) -> int:
        self.cleared.append(force)
        return 3


def _client(engine: _Engine | None = None, allow_clear: bool | None = None) -> TestClient:
    app = FastAPI()
    HTTPAPIRegistry(app).register_all_apis()
    if engine is not None:
        app.state.engine = engine
    if allow_clear is not None:
        app.state.allow_cache_clear = allow_clear
    return TestClient(app)


def test_every_group_is_mounted_and_apps_do_not_share_state() -> None:
    first, second = FastAPI(), FastAPI()
    for app in (first, second):
        HTTPAPIRegistry(app).register_all_apis()
    paths = set(first.openapi()["paths"])
    assert {"/", "/healthcheck", "/status", "/cache/clear", "/version", "/lmc_version"} <= paths
    assert set(first.openapi()["paths"]["/cache/clear"]) == {"post"}
    # The routers are module-level; the engine is per app.
    first.state.engine = _Engine()
    assert TestClient(first).get("/healthcheck").status_code == 200
    assert TestClient(second).get("/healthcheck").status_code == 503


def test_health_problems_make_the_healthcheck_fail() -> None:
    reply = _client(_Engine(problems=["disk tier unreachable"])).get("/healthcheck")
    assert reply.status_code == 503
    assert reply.json() == {"status": "unhealthy", "problems": ["disk tier unreachable"]}
    assert _client(_Engine()).get("/healthcheck").json() == {"status": "healthy"}


def test_status_falls_back_to_the_engines_status_document() -> None:
    assert _client(_Engine()).get("/status").json() == {"l1": {"chunks": 3}}


def test_version_routes_agree() -> None:
    client = _client()
    version = client.get("/lmc_version").json()
    assert client.get("/version").json() == f"{version}-{client.get('/commit_id').json()}"


def test_cache_clear_before_the_engine_is_503() -> None:
    assert _client(allow_clear=True).post("/cache/clear").status_code == 503


def test_cache_clear_is_off_unless_allowed() -> None:
    engine = _Engine()
    for allow in (None, False):
        reply = _client(engine, allow_clear=allow).post("/cache/clear")
        assert reply.status_code == 403 and reply.json()["error"] == "forbidden"
    assert engine.cleared == []


@pytest.mark.parametrize(
    ("headers", "status", "cleared"),
    [
        ({}, 401, []),
        ({"Authorization": "Bearer wrong-token-0123456789"}, 401, []),
        ({"Authorization": f"Bearer {TOKEN}"}, 200, [True]),
    ],
)
def test_cache_clear_needs_the_admin_token(
    headers: dict[str, str], status: int, cleared: list[bool]
) -> None:
    engine = _Engine(token=TOKEN)
    reply = _client(engine, allow_clear=True).post(
        "/cache/clear", headers=headers, json={"force": True}
    )
    assert reply.status_code == status, reply.text
    assert engine.cleared == cleared
    assert engine.refused_at == ([] if status == 200 else ["HTTP /cache/clear"])
    if status == 200:
        assert reply.json() == {"status": "ok", "removed": 3, "force": True}


def test_cache_clear_rejects_an_unknown_body() -> None:
    engine = _Engine()
    reply = _client(engine, allow_clear=True).post("/cache/clear", json={"tier": "l2"})
    assert reply.status_code == 400 and engine.cleared == []
