"""Shared fixtures of the connector tests that need a real server but no vLLM."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lmcache.v1.multiprocess.worker.client import MPClient, ServerUnavailableError, free_url


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Starts ``lmcache server`` (64 MiB L1, no HTTP/metrics ports) on a free local port
    with extra flags; returns its URL once it answers.  Stopped at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> str:
        url = free_url()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_MP_")}
        env.pop("LMCACHE_ADMIN_TOKEN", None)
        log_path = tmp_path / f"server-{len(procs)}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lmcache.cli.main", "server", "--port",
                 url.rsplit(":", 1)[1], "--l1-size-gb", "0.0625", "--http-port", "0",
                 "--prometheus-port", "0", *extra],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        procs.append(proc)
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            try:
                MPClient(url, timeout=2, connect_timeout=0.5).close()
                return url
            except ServerUnavailableError:
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.1)

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
