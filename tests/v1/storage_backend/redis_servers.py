"""Real ``redis-server`` processes for the Redis tier tests (no mocks, no fakeredis).

Servers bind 127.0.0.1 on free ports, persist nothing (``--save ""``, ``--appendonly no``)
and work in a temporary directory.  Without ``redis-server`` / ``redis-cli`` on PATH (CI's
``.ci/run`` installs the Debian package) or without redis-py, the tests using these
fixtures are skipped with the reason -- and fail under nox and in CI (``prerequisites``).

This module sits next to ``conftest.py`` (not inside ``redis/``) so both the conformance
suite and ``redis/`` tests import it; ``redis/`` has no ``__init__.py`` on purpose, so it
can never shadow the ``redis`` package.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prerequisites import require_module, require_prerequisite

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
START_TIMEOUT_S = 10.0


def skip_without_redis() -> None:
    """Skip locally, fail under nox/CI, without redis-server, redis-cli or redis-py."""
    require_prerequisite(
        "redis-server",
        REDIS_SERVER is not None and REDIS_CLI is not None,
        "redis-server/redis-cli not on PATH (apt-get install redis-server)",
    )
    require_module("redis", "redis-py not installed (pip install 'lmcache-core[redis]')")


def free_port(cluster_bus: bool = False) -> int:
    """A free local port; with ``cluster_bus`` also port + 10000 (the cluster bus)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not cluster_bus:
            return port
        if port + 10000 < 65536 and _is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair found")


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cli(port: int, *args: str, check: bool = True) -> str:
    assert REDIS_CLI is not None
    proc = subprocess.run(
        [REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"redis-cli {' '.join(args)}: {proc.stdout}{proc.stderr}")
    return proc.stdout


class RedisServer:
    """One redis-server process; can be SIGKILLed and restarted on the same port."""

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        cluster: bool = False,
        full_coverage: bool = True,
    ) -> None:
        self.cluster = cluster
        self.full_coverage = full_coverage
        self.port = port if port is not None else free_port(cluster_bus=cluster)
        self.workdir = workdir / f"redis-{self.port}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> RedisServer:
        assert REDIS_SERVER is not None
        args = [
            REDIS_SERVER,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.workdir),
            "--protected-mode", "yes",
        ]  # fmt: skip
        if self.cluster:
            args += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{self.port}.conf",
                "--cluster-node-timeout", "2000",
                "--cluster-require-full-coverage", "yes" if self.full_coverage else "no",
            ]  # fmt: skip
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log_tail()}")
            try:
                if _cli(self.port, "PING", check=False).strip() == "PONG":
                    return self
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on {self.port} did not start: {self.log_tail()}")

    def pause(self) -> None:
        """SIGSTOP: the process is alive and its socket accepts, but nothing is answered."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no goodbye to clients."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a paused server cannot exit on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def cli(self, *args: str) -> str:
        return _cli(self.port, *args)

    def log_tail(self) -> str:
        path = self.workdir / "redis.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


class RedisClusterProcs:
    """Three masters, no replicas, slots split evenly by ``redis-cli --cluster create``.
    ``full_coverage=False``: the others keep serving their slots while a node is down."""

    def __init__(self, workdir: Path, masters: int = 3, full_coverage: bool = True) -> None:
        self.nodes = [
            RedisServer(workdir, cluster=True, full_coverage=full_coverage) for _ in range(masters)
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisClusterProcs:
        for node in self.nodes:
            node.start()
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        _cli(self.nodes[0].port, "--cluster", "create", *addrs, "--cluster-yes")
        deadline = time.monotonic() + START_TIMEOUT_S * 2
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in self.nodes):
                return self
            time.sleep(0.1)
        raise RuntimeError("redis cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session (tests keep apart by namespace)."""
    skip_without_redis()
    with tempfile.TemporaryDirectory(prefix="lmc-redis-") as tmp:
        server = RedisServer(Path(tmp)).start()
        yield server
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcs]:
    """A 3-master Redis Cluster for the session."""
    skip_without_redis()
    with tempfile.TemporaryDirectory(prefix="lmc-redis-cluster-") as tmp:
        cluster = RedisClusterProcs(Path(tmp)).start()
        yield cluster
        cluster.stop()


@pytest.fixture
def own_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server only this test uses (to kill, corrupt or restart)."""
    skip_without_redis()
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def own_redis_cluster(tmp_path: Path) -> Iterator[RedisClusterProcs]:
    """A 3-master cluster only this test uses (to kill a node); the surviving masters keep
    serving their slots (cluster-require-full-coverage no)."""
    skip_without_redis()
    cluster = RedisClusterProcs(tmp_path, full_coverage=False)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def make_redis_backend(url: str, cpu: Any, cluster: bool = False, **options: Any) -> Any:
    """A RedisBackend on ``url`` in a namespace of its own (tests never see each other)."""
    from lmcache.v1.storage_backend.redis_backend import RedisBackend, RedisSettings

    namespace = options.pop("namespace", f"test-{uuid.uuid4().hex[:12]}")
    settings = RedisSettings(url=url, cluster=cluster, namespace=namespace, **options)
    return RedisBackend(dst_device="cpu", local_cpu_backend=cpu, settings=settings)
