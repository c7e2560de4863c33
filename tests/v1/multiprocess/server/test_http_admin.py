"""``POST /cache/clear`` keeps ``--enable-http-cache-clear`` and takes the admin token as
``Authorization: Bearer``; the HTTP flag does not open the wire (and vice versa)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from mp_server_helpers import ServerProcess, Stored, free_port

from lmcache.v1.multiprocess.wire.security import ADMIN_TOKEN_ENV
from lmcache.v1.multiprocess.worker.client import ServerError

TOKEN = "http-admin-token-" + "fedcba9876543210"
WRONG = "http-wrong-token-" + "0123456789abcdef"


@pytest.fixture(autouse=True)
def _no_token_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "token"
    path.write_text(TOKEN)
    return path


def _start(factory: Callable[..., ServerProcess], *args: str) -> tuple[ServerProcess, httpx.Client]:
    port = free_port()
    server = factory("--supported-transfer-mode", "engine_driven", "--http-port", str(port), *args)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            http.get("/")
            return server, http
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"HTTP frontend did not come up:\n{server.log()}")


@pytest.fixture(scope="module")
def guarded(
    server_factory: Callable[..., ServerProcess], token_file: Path
) -> tuple[ServerProcess, httpx.Client]:
    """--enable-http-cache-clear with an admin token."""
    return _start(
        server_factory, "--enable-http-cache-clear", "--admin-token-file", str(token_file)
    )


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(
    ("headers", "kwargs", "challenge", "reason"),
    [
        ({}, {}, 'Bearer realm="lmcache"', "Authorization: Bearer"),
        ({"Authorization": f"Basic {TOKEN}"}, {}, 'Bearer realm="lmcache"', "Bearer"),
        ({"Authorization": "Bearer"}, {}, 'Bearer realm="lmcache"', "Bearer"),
        (_bearer(WRONG), {}, 'error="invalid_token"', "wrong"),
        (_bearer(TOKEN[:-1]), {}, 'error="invalid_token"', "wrong"),
        # The token is checked before the body: a bad body without it is still a 401.
        ({}, {"content": b"{not json"}, 'Bearer realm="lmcache"', "Bearer"),
    ],
)
def test_clear_without_the_right_token_is_401_and_data_survives(
    guarded: tuple[ServerProcess, httpx.Client],
    headers: dict[str, str],
    kwargs: dict[str, bytes],
    challenge: str,
    reason: str,
) -> None:
    server, http = guarded
    with Stored(server) as data:
        refused = http.post("/cache/clear", headers=headers, **kwargs)  # type: ignore[arg-type]
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"] == "unauthorized"
        assert reason in refused.json()["message"]
        assert challenge in refused.headers["www-authenticate"]
        assert data.retrieves_bit_exact()
    assert TOKEN not in server.log() and WRONG not in server.log()


def test_clear_with_the_token_clears(guarded: tuple[ServerProcess, httpx.Client]) -> None:
    server, http = guarded
    with Stored(server) as data:
        cleared = http.post(
            "/cache/clear", headers={"authorization": f"bearer {TOKEN}"}, json={"force": True}
        )
        assert cleared.status_code == 200, cleared.text
        assert cleared.json()["status"] == "ok" and cleared.json()["removed"] >= 3
        assert data.is_gone()
        assert not data.retrieves_bit_exact()
        # The HTTP flag does not open the wire: admin ops there still need their own flag.
        with server.client() as client, pytest.raises(ServerError) as info:
            client.clear(admin_token=TOKEN)
        assert info.value.code == "forbidden"
    assert TOKEN not in server.log()


def test_the_token_does_not_replace_the_flag(
    server_factory: Callable[..., ServerProcess], token_file: Path
) -> None:
    server, http = _start(server_factory, "--admin-token-file", str(token_file))
    with Stored(server) as data:
        refused = http.post("/cache/clear", headers=_bearer(TOKEN))
        assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
        assert "--enable-http-cache-clear" in refused.json()["message"]
        assert data.retrieves_bit_exact()
    assert "admin token is configured, but neither --enable-admin-ops" in server.log()


def test_without_a_token_the_flag_alone_allows_clear(
    server_factory: Callable[..., ServerProcess],
) -> None:
    server, http = _start(server_factory, "--enable-http-cache-clear")
    with Stored(server) as data:
        cleared = http.post("/cache/clear")
        assert cleared.status_code == 200, cleared.text
        assert data.is_gone()


# -- operator routes (lmcache.v1.internal_api_server.common) on the real server --------------

SECRET_ENV = "LMC_TEST_STORAGE_PASSWORD"
SECRET_VALUE = "env-secret-" + "5f1e2d3c4b5a6978"


@pytest.fixture(scope="module")
def scripted(
    server_factory: Callable[..., ServerProcess], token_file: Path
) -> tuple[ServerProcess, httpx.Client]:
    """--run-script-api-enabled (math importable) with an admin token, and a secret in the
    server's environment."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SECRET_ENV, SECRET_VALUE)
        patch.setenv("LMC_TEST_PLAIN_SETTING", "plain-value")
        return _start(
            server_factory,
            "--run-script-api-enabled", "--script-allowed-imports", "math",
            "--admin-token-file", str(token_file),
        )  # fmt: skip


def _run(http: httpx.Client, source: bytes, token: str | None = TOKEN) -> httpx.Response:
    headers = _bearer(token) if token else {}
    return http.post("/run_script", files={"script": ("s.py", source)}, headers=headers)


def test_env_needs_the_token_and_redacts_secrets(
    scripted: tuple[ServerProcess, httpx.Client],
) -> None:
    server, http = scripted
    refused = http.get("/env")
    assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
    env = http.get("/env", headers=_bearer(TOKEN))
    assert env.status_code == 200
    assert '"LMC_TEST_PLAIN_SETTING": "plain-value"' in env.text
    assert f'"{SECRET_ENV}": "***"' in env.text
    assert SECRET_VALUE not in env.text and SECRET_VALUE not in server.log()


def test_reading_and_setting_log_levels_need_the_token(
    scripted: tuple[ServerProcess, httpx.Client],
) -> None:
    _server, http = scripted
    query = "/loglevel?logger_name=lmcache.v1.multiprocess&level=DEBUG"
    read = "/loglevel?logger_name=lmcache.v1.multiprocess"
    assert http.get(query).status_code == 401
    # Reading needs it too (the listing names every module of the server).
    assert http.get(read).status_code == 401 and http.get("/loglevel").status_code == 401
    assert http.get(read, headers=_bearer(TOKEN)).text.endswith("NOTSET")
    assert http.get(query, headers=_bearer(TOKEN)).status_code == 200
    assert http.get(read, headers=_bearer(TOKEN)).text.endswith("DEBUG")
    # Reading threads needs no token; the frontend's own thread is there.
    assert "lmc-http" in http.get("/threads").text


def test_run_script_needs_the_token_then_sees_the_server(
    scripted: tuple[ServerProcess, httpx.Client],
) -> None:
    server, http = scripted
    marker = b"app.state.touched = 'by-an-unauthorized-script'"
    assert _run(http, marker, token=None).status_code == 401
    assert _run(http, marker, token=WRONG).status_code == 401
    # The refused script never ran: the app state does not hold its mark.
    probe = _run(http, b"result = app.state._state.get('touched', 'untouched')")
    assert probe.status_code == 200 and probe.text == "untouched"
    chunk = _run(http, b"result = app.state.configs['mp'].chunk_size")
    assert chunk.text == "16"
    assert _run(http, b"import math\nresult = math.isqrt(99)").text == "9"
    refused = _run(http, b"import subprocess")
    assert refused.status_code == 500 and "not allowed" in refused.text
    log = server.log()
    assert "POST /run_script is enabled" in log and "run_script: executing" in log
    assert TOKEN not in log


def test_run_script_is_404_without_its_flag(guarded: tuple[ServerProcess, httpx.Client]) -> None:
    _server, http = guarded
    reply = _run(http, b"result = 1")
    assert reply.status_code == 404 and "disabled" in reply.text
