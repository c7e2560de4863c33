"""Cache-context transfer through a real ``lmcache server``, in each transfer mode the
backend declares: KV on the backend's device -> server -> back into other blocks, bit-exact.

The server and the worker process both run with the backend under test selected
(``LMCACHE_DEVICE_BACKEND``), as a deployment would.  ``engine_driven`` is declared by
every backend (the worker copies through the server's shared memory with the backend's
ops); ``lmcache_driven`` where ``is_lmcache_driven_available()`` (the server maps the
worker's KV through the backend's IPC wrapper, copies with its cache context and orders
the copies with its event IPC).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmcache.v1.platform.registry import DEVICE_BACKEND_ENV_VAR, DEVICE_TYPE_ENV_VAR

TOKENS = 300  # one full 256-token chunk and a partial one
SERVER_START_S = 90.0
WORKER_TIMEOUT_S = 300
# Variables that would pick another backend or mode than the test asks for.
_STRIPPED_ENV_VARS = (DEVICE_TYPE_ENV_VAR, "LMCACHE_MP_TRANSFER_MODE")


def _backend_env(backend_name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _STRIPPED_ENV_VARS}
    env[DEVICE_BACKEND_ENV_VAR] = backend_name
    env["LMCACHE_LOG_LEVEL"] = "WARNING"
    return env


def _wait_until_serving(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    from lmcache.v1.multiprocess.worker.client import MPClient, ServerUnavailableError

    deadline = time.monotonic() + SERVER_START_S
    while True:
        try:
            MPClient(url, timeout=2, connect_timeout=0.5).close()
            return
        except ServerUnavailableError:
            if proc.poll() is not None or time.monotonic() > deadline:
                output = log.read_text(errors="replace")[-3000:]
                pytest.fail(f"lmcache server did not start on {url}:\n{output}", pytrace=False)
            time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server removes its shared memory), SIGKILL if it hangs."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    from lmcache.v1.platform.cpu.shm import SHM_DIR

    for path in Path(SHM_DIR).glob(f"lmcache_mp_{proc.pid}_*"):  # what a kill left behind
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def server_url(available_spec: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``lmcache server`` with the backend under test selected (both modes)."""
    from lmcache.v1.multiprocess.worker.client import free_url

    url = free_url()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmcache.cli.main", "server", "--port", url.rsplit(":", 1)[1],
             "--http-port", "0", "--prometheus-port", "0", "--supported-transfer-mode", "auto"],
            env=_backend_env(available_spec.backend_name), stdout=sink, stderr=sink,
        )  # fmt: skip
    try:
        _wait_until_serving(url, proc, log)
        yield url
    finally:
        _stop(proc)


def _declared(spec: Any, mode: str) -> None:
    if mode == "lmcache_driven" and not spec.is_lmcache_driven_available():
        pytest.skip(
            f"backend {spec.backend_name!r} declares no LMCache-driven transfer "
            "(is_lmcache_driven_available() is False)"
        )


@pytest.mark.parametrize("mode", ["engine_driven", "lmcache_driven"])
def test_kv_round_trip_through_the_server_is_bit_exact(
    available_spec: Any, mode: str, request: pytest.FixtureRequest
) -> None:
    _declared(available_spec, mode)
    url = request.getfixturevalue("server_url")  # started only when a mode is declared
    proc = subprocess.run(
        [sys.executable, "-m", "lmcache.testing._round_trip_worker", "--url", url, "--mode",
         mode, "--backend", available_spec.backend_name, "--tokens", str(TOKENS)],
        env=_backend_env(available_spec.backend_name), capture_output=True, text=True,
        timeout=WORKER_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["modes"] == [mode, mode], report
    assert report["stored"] is True, report
    assert report["hit"] == TOKENS, report
    assert report["retrieved"] is True, report
    assert report["bit_exact"] is True, f"retrieved KV differs from the stored KV: {report}"
    assert report["others_untouched"] is True, f"the retrieve wrote other blocks: {report}"
    assert report["unseen_prompt_hit"] == 0, report
