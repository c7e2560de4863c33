"""``--run-script-api-enabled`` on an HTTP frontend bound beyond loopback is refused at
start-up (one line, non-zero exit, nothing left behind) unless an admin token is set."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from frontend_helpers import ADMIN_TOKEN
from mp_server_helpers import BASE_ARGS, ServerProcess, free_port

from lmcache.v1.multiprocess.wire.security import (
    ADMIN_TOKEN_ENV,
    AdminPolicy,
    check_run_script_exposure,
)
from lmcache.v1.multiprocess.worker.client import MPClient, ServerUnavailableError

START_TIMEOUT_S = 120


def _server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ADMIN_TOKEN_ENV}
    env["LMCACHE_LOG_LEVEL"] = "WARNING"
    return env


def _start_or_refuse(args: list[str], log_path: Path) -> tuple[int | None, str]:
    """Run ``lmcache server`` until it exits (its status and output) or is serving (None,
    after a clean SIGTERM): a server that starts fails the test at once, not by a timeout."""
    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmcache.cli.main", "server", "--port", str(port), *args],
            stdout=log, stderr=subprocess.STDOUT, env=_server_env(), text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    MPClient(f"tcp://127.0.0.1:{port}", timeout=2, connect_timeout=0.5).close()
                    break  # serving
                except ServerUnavailableError:
                    time.sleep(0.1)
        finally:
            started = proc.poll() is None
            if started:
                proc.send_signal(signal.SIGTERM)  # a clean stop removes its segment
                proc.wait(30)
    if started:
        return None, log_path.read_text()
    return proc.returncode, log_path.read_text()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1"])
def test_a_real_server_refuses_run_script_beyond_loopback_without_a_token(
    host: str, tmp_path: Path
) -> None:
    status, output = _start_or_refuse(
        [*BASE_ARGS, "--http-host", host, "--http-port", str(free_port()),
         "--prometheus-port", "0", "--run-script-api-enabled"],
        tmp_path / "server.log",
    )  # fmt: skip
    assert status is not None, f"the server started instead of refusing:\n{output}"
    assert status != 0, output
    errors = [line for line in output.splitlines() if line.startswith("lmcache server: error:")]
    assert len(errors) == 1, output
    (line,) = errors
    assert line.startswith("lmcache server: error: --run-script-api-enabled on --http-host")
    assert host in line and "admin token" in line and "--admin-token-file" in line
    assert "Traceback" not in output
    # Refused before anything was made or bound.
    assert "HTTP frontend" not in output and "listening on" not in output


def test_a_loopback_frontend_may_run_scripts_without_a_token(tmp_path: Path) -> None:
    http_port = free_port()
    server = ServerProcess(
        [*BASE_ARGS, "--http-host", "127.0.0.2", "--http-port", str(http_port),
         "--run-script-api-enabled"],
        tmp_path / "server.log",
    )  # fmt: skip
    try:
        server.wait_ready()
        reply = None
        deadline = time.monotonic() + 20
        while reply is None and time.monotonic() < deadline:
            try:
                reply = httpx.post(
                    f"http://127.0.0.2:{http_port}/run_script",
                    files={"script": ("s.py", b"result = 'loopback'")},
                    timeout=10,
                )
            except httpx.TransportError:
                time.sleep(0.1)
        assert reply is not None and reply.status_code == 200 and reply.text == "loopback"
        assert "for any local process (no admin token is configured)" in server.log()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("enabled", "host", "port", "token", "refused"),
    [
        (True, "0.0.0.0", 8080, None, True),
        (True, "::", 8080, None, True),
        (True, "10.1.2.3", 8080, None, True),
        (True, "no-such-host.invalid", 8080, None, True),
        (True, "0.0.0.0", 8080, ADMIN_TOKEN, False),
        (True, "0.0.0.0", 0, None, False),  # the frontend is off
        (True, "127.0.0.1", 8080, None, False),
        (True, "::1", 8080, None, False),
        (True, "localhost", 8080, None, False),
        (False, "0.0.0.0", 8080, None, False),
    ],
)
def test_the_exposure_rule(
    enabled: bool, host: str, port: int, token: str | None, refused: bool
) -> None:
    policy = AdminPolicy(token=token)
    if refused:
        with pytest.raises(ValueError, match="needs an admin token"):
            check_run_script_exposure(enabled, host, port, policy)
    else:
        check_run_script_exposure(enabled, host, port, policy)
