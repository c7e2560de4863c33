"""Refused admin requests are logged under the route (or wire operation) they came to, and
rate-limited per route: a flood on one route neither fills the log nor hides another."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from frontend_helpers import ADMIN_TOKEN

from lmcache.v1.multiprocess.server import MPCacheServer
from lmcache.v1.multiprocess.server.http_frontend import build_app
from lmcache.v1.multiprocess.server.rate_limited_logs import RefusalLog

LOGGER = "lmcache.v1.multiprocess.server.rate_limited_logs"


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_each_http_refusal_is_logged_under_its_own_route(
    make_engine: Callable[..., MPCacheServer], caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(
        admin_token=ADMIN_TOKEN, run_script_api_enabled=True, enable_http_cache_clear=True
    )
    client = TestClient(build_app(engine, allow_cache_clear=True))
    caplog.set_level(logging.WARNING, logger=LOGGER)
    script = {"script": ("s.py", b"result = 1")}
    assert client.post("/run_script", files=script).status_code == 401
    assert client.get("/env").status_code == 401
    assert client.get("/loglevel", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/cache/clear").status_code == 401
    assert _refusals(caplog) == [
        "refused admin request HTTP /run_script (missing admin token)",
        "refused admin request HTTP /env (missing admin token)",
        "refused admin request HTTP /loglevel (wrong admin token)",
        "refused admin request HTTP /cache/clear (missing admin token)",
    ]
    # Within the interval, a second refusal on each route is counted, not logged.
    caplog.clear()
    assert client.post("/run_script", files=script).status_code == 401
    assert client.get("/env").status_code == 401
    assert _refusals(caplog) == []
    assert ADMIN_TOKEN not in caplog.text


def test_the_refusal_log_keeps_a_window_per_route(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    log = RefusalLog(interval_s=60.0, max_keys=3, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger=LOGGER)
    for _ in range(5):
        log.note("HTTP /run_script", "missing admin token")
    log.note("HTTP /env", "missing admin token")
    log.note("clear", "admin operations are off")
    assert _refusals(caplog) == [
        "refused admin request HTTP /run_script (missing admin token)",
        "refused admin request HTTP /env (missing admin token)",
        "refused admin request clear (admin operations are off)",
    ]
    caplog.clear()
    # Past max_keys, new names share one window (the set of names cannot grow the memory).
    log.note("HTTP /a", "wrong admin token")
    log.note("HTTP /b", "wrong admin token")
    assert _refusals(caplog) == ["refused admin request HTTP /a (wrong admin token)"]
    caplog.clear()
    now[0] += 61.0
    log.note("HTTP /run_script", "missing admin token")
    log.note("HTTP /env", "missing admin token")
    assert _refusals(caplog) == [
        "refused admin request HTTP /run_script (missing admin token) (4 more like it in "
        "the last 60s not logged)",
        "refused admin request HTTP /env (missing admin token)",
    ]
