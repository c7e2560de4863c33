"""The operator routes of ``lmcache.v1.internal_api_server.common`` on a bare FastAPI app:
what each answers, what ``app.state`` switches, and every refusal."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lmcache.compat.upstream_056.http_apis import common_api
from lmcache.compat.upstream_056.periodic_thread import (
    PeriodicThread,
    PeriodicThreadRegistry,
    ThreadLevel,
    ThreadRunSummary,
)
from lmcache.v1.multiprocess.server.operator_routes import run_script_api
from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.utils.secrets import REDACTED


def _client(**state: Any) -> TestClient:
    app = FastAPI()
    app.include_router(common_api.router)
    for name, value in state.items():
        setattr(app.state, name, value)
    return TestClient(app)


def _refuse_all(_request: Request) -> Response:
    return JSONResponse({"error": "unauthorized"}, status_code=401)


def _script(client: TestClient, source: bytes) -> Any:
    return client.post("/run_script", files={"script": ("s.py", source, "text/plain")})


def test_every_common_route_is_mounted() -> None:
    paths = set(_client().app.openapi()["paths"])
    assert paths >= {
        "/env",
        "/loglevel",
        "/threads",
        "/metrics",
        "/periodic-threads",
        "/periodic-threads/{thread_name}",
        "/periodic-threads-health",
        "/run_script",
    }


def test_env_redacts_secrets_by_name_and_in_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMC_TEST_DB_PASSWORD", "hunter2-secret-value")
    monkeypatch.setenv("LMC_TEST_REMOTE", "redis://cache:pw-in-url@10.0.0.1:6379/0")
    monkeypatch.setenv("LMC_TEST_TOKEN_FILE", "/run/secrets/token")
    monkeypatch.setenv("LMC_TEST_PLAIN", "visible")
    response = _client().get("/env")
    assert response.status_code == 200
    env = json.loads(response.text)
    assert env["LMC_TEST_DB_PASSWORD"] == REDACTED
    assert env["LMC_TEST_REMOTE"] == f"redis://cache:{REDACTED}@10.0.0.1:6379/0"
    assert env["LMC_TEST_TOKEN_FILE"] == "/run/secrets/token"  # where it is, not what
    assert env["LMC_TEST_PLAIN"] == "visible"
    assert "hunter2" not in response.text and "pw-in-url" not in response.text


def test_env_and_log_levels_ask_the_app_to_authorize(scratch_logger: logging.Logger) -> None:
    client = _client(authorize=_refuse_all)
    assert client.get("/env").status_code == 401
    assert client.get("/loglevel?logger_name=lmc.test.levels&level=DEBUG").status_code == 401
    assert scratch_logger.level == logging.NOTSET
    # Reading levels (one, or the listing of every module) is guarded too.
    assert client.get("/loglevel?logger_name=lmc.test.levels").status_code == 401
    assert client.get("/loglevel").status_code == 401
    assert client.get("/threads").status_code == 200


def _logger_count() -> int:
    return len(logging.Logger.manager.loggerDict)


def test_reading_unknown_loggers_creates_none() -> None:
    client = _client()
    before = _logger_count()
    for i in range(2000):
        reply = client.get(f"/loglevel?logger_name=lmc.test.unknown.n{i}")
        assert reply.status_code == 404, reply.text
        assert reply.json()["error"] == "not_found"
    assert "lmc.test.unknown.n1999" in reply.json()["message"]
    listing = client.get("/loglevel")
    assert listing.status_code == 200 and "lmc.test.unknown" not in listing.text
    assert _logger_count() == before
    assert "lmc.test.unknown.n0" not in logging.Logger.manager.loggerDict


def test_setting_an_unknown_logger_creates_none() -> None:
    client = _client()
    before = _logger_count()
    for i in range(200):
        reply = client.get(f"/loglevel?logger_name=lmc.test.unset.n{i}&level=DEBUG")
        assert reply.status_code == 404 and reply.json()["error"] == "not_found"
    assert _logger_count() == before


def test_a_placeholder_reads_notset_and_can_be_set(scratch_logger: logging.Logger) -> None:
    """``lmc.test`` exists only as the parent of ``lmc.test.levels``: readable, settable."""
    parent = logging.Logger.manager.loggerDict.get("lmc.test")
    client = _client()
    if not isinstance(parent, logging.Logger):
        assert client.get("/loglevel?logger_name=lmc.test").text == "lmc.test: NOTSET"
        assert not isinstance(logging.Logger.manager.loggerDict.get("lmc.test"), logging.Logger)
    try:
        assert client.get("/loglevel?logger_name=lmc.test&level=ERROR").status_code == 200
        assert logging.getLogger("lmc.test").level == logging.ERROR
        assert client.get("/loglevel?logger_name=root").status_code == 200
    finally:
        logging.getLogger("lmc.test").setLevel(logging.NOTSET)


@pytest.fixture
def scratch_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("lmc.test.levels")
    handler = logging.NullHandler()
    logger.addHandler(handler)
    yield logger
    logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)


def test_loglevel_reads_sets_and_lists(scratch_logger: logging.Logger) -> None:
    client = _client()
    set_reply = client.get("/loglevel?logger_name=lmc.test.levels&level=debug")
    assert set_reply.status_code == 200 and "DEBUG" in set_reply.text
    assert scratch_logger.level == logging.DEBUG
    assert all(h.level == logging.DEBUG for h in scratch_logger.handlers)
    assert client.get("/loglevel?logger_name=lmc.test.levels").text == "lmc.test.levels: DEBUG"
    listing = client.get("/loglevel").text
    assert listing.startswith("=== Loggers and Levels ===")
    assert "lmc.test.levels: DEBUG" in listing


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("logger_name=lmc.test.levels&level=LOUD", "Invalid log level: LOUD"),
        # A logging attribute that is not a level (upstream's getattr lookup took it).
        ("logger_name=lmc.test.levels&level=BASIC_FORMAT", "Invalid log level"),
        ("level=DEBUG", "needs a logger_name"),
    ],
)
def test_loglevel_refuses_what_is_not_a_level(
    scratch_logger: logging.Logger, query: str, message: str
) -> None:
    reply = _client().get(f"/loglevel?{query}")
    assert reply.status_code == 400 and message in reply.text
    assert scratch_logger.level == logging.NOTSET


def test_threads_show_stacks_and_filter() -> None:
    release = threading.Event()

    def parked_in_a_recognisable_frame() -> None:
        release.wait(30)

    worker = threading.Thread(target=parked_in_a_recognisable_frame, name="lmc-test-parked")
    worker.start()
    try:
        client = _client()
        text = client.get("/threads?name=TEST-PARKED").text
        assert "lmc-test-parked" in text and "parked_in_a_recognisable_frame" in text
        assert text.rstrip().endswith("Total threads: 1")
        by_id = client.get(f"/threads?thread_id={worker.ident}").text
        assert "lmc-test-parked" in by_id and "Total threads: 1" in by_id
        assert "Total threads: 0" in client.get("/threads?name=no-such-thread").text
    finally:
        release.set()
        worker.join()


class _Cycle(PeriodicThread):
    def __init__(self, name: str, level: ThreadLevel, interval: float, stall: threading.Event):
        super().__init__(name, interval, level)
        self.stall = stall

    def _execute(self) -> ThreadRunSummary:
        self.stall.wait(30)  # a stalled cycle: the thread stays running but goes inactive
        return ThreadRunSummary(success=True, message="ran")


@pytest.fixture
def registry() -> Iterator[PeriodicThreadRegistry]:
    PeriodicThreadRegistry.reset()
    yield PeriodicThreadRegistry.get_instance()
    PeriodicThreadRegistry.reset()


def test_periodic_threads_report_and_health(registry: PeriodicThreadRegistry) -> None:
    stall = threading.Event()
    stuck = _Cycle("lmc-test-critical", ThreadLevel.CRITICAL, 0.05, stall)
    calm = _Cycle("lmc-test-low", ThreadLevel.LOW, 60.0, threading.Event())
    calm.stall.set()
    for thread in (stuck, calm):
        registry.register(thread)
        thread.start()
    try:
        client = _client()
        deadline = time.monotonic() + 10
        while stuck.is_active and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not stuck.is_active and stuck.is_running
        listing = client.get("/periodic-threads").json()
        assert listing["summary"]["total_count"] == 2
        assert {t["name"] for t in listing["threads"]} == {"lmc-test-critical", "lmc-test-low"}
        critical = client.get("/periodic-threads?level=CRITICAL").json()["threads"]
        assert [t["name"] for t in critical] == ["lmc-test-critical"]
        active = client.get("/periodic-threads?active_only=true").json()["threads"]
        assert [t["name"] for t in active] == ["lmc-test-low"]
        one = client.get("/periodic-threads/lmc-test-low")
        assert one.status_code == 200 and one.json()["level"] == "low"
        assert client.get("/periodic-threads/nope").status_code == 404
        bad = client.get("/periodic-threads?level=urgent")
        assert bad.status_code == 400 and "critical" in bad.json()["error"]
        health = client.get("/periodic-threads-health").json()
        assert health["healthy"] is False and health["unhealthy_count"] == 1
        assert health["unhealthy_threads"][0]["name"] == "lmc-test-critical"
    finally:
        stall.set()
        for thread in (stuck, calm):
            thread.stop()
    assert _client().get("/periodic-threads-health").json()["healthy"] is True


def test_metrics_prefer_the_apps_registry() -> None:
    own = _client(metrics_exposition=lambda: (b"lmc_test_metric 1\n", "text/plain; version=0.0.4"))
    reply = own.get("/metrics")
    assert reply.status_code == 200 and reply.text == "lmc_test_metric 1\n"
    default = _client().get("/metrics")
    assert default.status_code == 200 and "python_info" in default.text


ENABLED = {"configs": {"mp": MPServerConfig(run_script_api_enabled=True)}}


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"configs": {"mp": MPServerConfig()}},
        {"lmcache_adapter": SimpleNamespace(config=SimpleNamespace())},
    ],
    ids=["no-state", "mp-default", "adapter-without-setting"],
)
def test_run_script_is_off_unless_enabled(state: dict[str, Any]) -> None:
    client = _client(**state)
    reply = _script(client, b"app.state.ran = True")
    assert reply.status_code == 404 and "disabled" in reply.text
    assert not hasattr(client.app.state, "ran")


def test_run_script_runs_with_the_app_in_scope() -> None:
    client = _client(**ENABLED)
    assert _script(client, b"result = 6 * 7").text == "42"
    assert _script(client, b"app.state.ran = 'yes'").text == run_script_api.DEFAULT_RESULT
    assert client.app.state.ran == "yes"
    chunk = _script(client, b"result = app.state.configs['mp'].chunk_size")
    assert chunk.text == str(MPServerConfig().chunk_size)


def test_run_script_imports_only_what_is_allowed() -> None:
    config = MPServerConfig(run_script_api_enabled=True, script_allowed_imports=["math"])
    client = _client(configs={"mp": config})
    assert _script(client, b"import math\nresult = math.floor(3.9)").text == "3"
    refused = _script(client, b"import os\nresult = os.getcwd()")
    assert refused.status_code == 500 and "Import of 'os' is not allowed" in refused.text
    no_open = _script(client, b"result = open('/etc/hostname').read()")
    assert no_open.status_code == 500 and "open" in no_open.text


def test_run_script_that_exits_is_an_error_reply_not_a_dead_frontend() -> None:
    config = MPServerConfig(run_script_api_enabled=True, script_allowed_imports=["sys"])
    client = _client(configs={"mp": config})
    exited = _script(client, b"import sys\nsys.exit(3)")
    assert exited.status_code == 500 and "SystemExit(3)" in exited.text
    assert _script(client, b"result = 'still serving'").text == "still serving"


def test_run_script_refusals_come_before_execution() -> None:
    guarded = _client(authorize=_refuse_all, **ENABLED)
    assert _script(guarded, b"app.state.ran = True").status_code == 401
    assert not hasattr(guarded.app.state, "ran")
    client = _client(**ENABLED)
    missing = client.post("/run_script", data={"script": "not a file"})
    assert missing.status_code == 400 and "No script file" in missing.text
    huge = _script(client, b"app.state.ran = True\n" + b"#" * run_script_api.MAX_SCRIPT_BYTES)
    assert huge.status_code == 413
    assert not hasattr(client.app.state, "ran")
    broken = _script(client, b"result = (")
    assert broken.status_code == 400 and "does not compile" in broken.json()["message"]
    failing = _script(client, b"result = 1 / 0")
    assert failing.status_code == 500 and "Error executing script" in failing.text


def test_run_script_reads_the_in_process_adapter_setting() -> None:
    adapter = SimpleNamespace(
        config=SimpleNamespace(run_script_api_enabled=True, script_allowed_imports=None)
    )
    assert _script(_client(lmcache_adapter=adapter), b"result = 'hello'").text == "hello"
