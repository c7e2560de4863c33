"""``small_server``: real ``lmcache server`` processes for the connector tests (vLLM, SGLang)
that need a server but no engine.  Imported as ``small_servers`` by their conftest files
(``tests/`` is on ``sys.path``, like ``prerequisites``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmcache.v1.multiprocess.wire.curve import CurveClientKeys
from lmcache.v1.multiprocess.worker.client import MPClient, ServerUnavailableError, free_url


class SmallServers:
    """``lmcache server`` processes (64 MiB L1 by default, no HTTP/metrics ports) on free
    local ports; calling it starts one with extra flags and returns its URL once it answers."""

    def __init__(self, log_dir: Path, l1_size_gb: float = 0.0625) -> None:
        self.log_dir = log_dir
        self.l1_size_gb = l1_size_gb
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def __call__(
        self, *extra: str, url: str | None = None, curve: CurveClientKeys | None = None
    ) -> str:
        """``url``: a port to reuse (a restart of a killed server); default a free one.
        ``curve``: the client keys to probe a server started with CURVE flags."""
        url = url or free_url()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_MP_")}
        env.pop("LMCACHE_ADMIN_TOKEN", None)
        log_path = self.log_dir / f"server-{len(self.procs)}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lmcache.cli.main", "server", "--port",
                 url.rsplit(":", 1)[1], "--l1-size-gb", str(self.l1_size_gb), "--http-port", "0",
                 "--prometheus-port", "0", *extra],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        self.procs[url] = proc
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            try:
                MPClient(url, timeout=2, connect_timeout=0.5, curve=curve).close()
                return url
            except ServerUnavailableError:
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.1)

    def kill(self, url: str) -> None:
        """``kill -9`` of the server at ``url``."""
        proc = self.procs[url]
        proc.kill()
        proc.wait(15)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[SmallServers]:
    """Starts servers on demand (see :class:`SmallServers`); all stopped at teardown."""
    servers = SmallServers(tmp_path)
    yield servers
    servers.stop_all()
