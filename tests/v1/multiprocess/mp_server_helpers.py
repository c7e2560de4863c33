"""Helpers of the MP server suite: server subprocesses on free ports, KV caches."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from lmcache.v1.multiprocess.server import MPServer, build_cache_server
from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.multiprocess.wire.curve import CurveClientKeys
from lmcache.v1.multiprocess.worker.client import MPClient, ServerUnavailableError

SMALL_LAYOUT = {"num_layers": 3, "num_blocks": 48, "block_size": 4, "num_heads": 2, "head_size": 8}
CHUNK_SIZE = 16
BASE_ARGS = ["--chunk-size", str(CHUNK_SIZE), "--l1-size-gb", "0.0625", "--max-workers", "2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(
        self,
        args: list[str],
        log_path: Path,
        port: int | None = None,
        curve: CurveClientKeys | None = None,
    ) -> None:
        # ``curve``: the keys this helper's own clients use (a server with CURVE keys).
        self.curve = curve
        # A given port restarts a server where a killed one listened.
        self.port = free_port() if port is None else port
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        # A developer's LMCACHE_ADMIN_TOKEN would make test servers demand it.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("LMCACHE_MP_") and k != "LMCACHE_ADMIN_TOKEN"
        }
        env["LMCACHE_LOG_LEVEL"] = "WARNING"
        # The HTTP frontend and the Prometheus endpoint are off unless a test asks for them
        # (their default ports would collide between concurrent servers).
        if "--http-port" not in args:
            args = [*args, "--http-port", "0"]
        if "--prometheus-port" not in args:
            args = [*args, "--prometheus-port", "0"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lmcache.cli.main", "server", "--port", str(self.port), *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                MPClient(self.url, timeout=2, connect_timeout=0.5, curve=self.curve).close()
                return
            except ServerUnavailableError:
                time.sleep(0.1)
        raise RuntimeError(f"server did not come up:\n{self.log()}")

    def client(self, timeout: float = 10.0) -> MPClient:
        return MPClient(self.url, timeout=timeout, curve=self.curve)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return int(self.proc.returncode)


def make_kv(
    shm: bool = False,
    dtype: torch.dtype = torch.bfloat16,
    seed: int | None = 0,
    **overrides: int,
) -> list[torch.Tensor]:
    """Per-layer paged KV caches ``[2, NB, BS, NH, HS]`` filled with random values."""
    from lmcache.v1.platform.cpu.shm import empty_shm_tensor

    geo = {**SMALL_LAYOUT, **overrides}
    shape = (2, geo["num_blocks"], geo["block_size"], geo["num_heads"], geo["head_size"])
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    layers = []
    for _ in range(geo["num_layers"]):
        tensor = empty_shm_tensor(shape, dtype) if shm else torch.zeros(shape, dtype=dtype)
        if seed is not None:
            tensor.copy_(torch.randn(shape, generator=gen).to(dtype))
        layers.append(tensor)
    return layers


def unlink_kv(kv: list[torch.Tensor]) -> None:
    from lmcache.v1.platform.cpu.shm import shm_segment_of, unlink_segment

    for tensor in kv:
        name = shm_segment_of(tensor)
        if name:
            unlink_segment(name)


STORED_TOKENS = list(range(11, 11 + 3 * CHUNK_SIZE))
STORED_BLOCKS = list(range(len(STORED_TOKENS) // 4))


class Stored:
    """A worker that stored STORED_TOKENS and a copy of what it stored, so a later retrieve
    is checked bit for bit.  A context manager: closes the worker, unlinks its KV cache."""

    def __init__(self, server: ServerProcess) -> None:
        from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

        self.kv = make_kv(seed=7)
        self.expected = [layer[:, STORED_BLOCKS].clone() for layer in self.kv]
        self.worker = KVCacheWorker(
            self.kv,
            model_name=f"stored-{uuid.uuid4().hex[:8]}",
            server_url=server.url,
            mode="engine_driven",
            sub_path="shm",
        )
        assert self.worker.store(STORED_TOKENS, STORED_BLOCKS)
        assert self.worker.lookup(STORED_TOKENS) == len(STORED_TOKENS)

    def retrieves_bit_exact(self) -> bool:
        for layer in self.kv:
            layer.zero_()
        if not self.worker.retrieve(STORED_TOKENS, STORED_BLOCKS):
            return False
        return all(
            torch.equal(layer[:, STORED_BLOCKS], e) for layer, e in zip(self.kv, self.expected)
        )

    def is_gone(self) -> bool:
        return self.worker.lookup(STORED_TOKENS) == 0

    def close(self) -> None:
        self.worker.close()
        unlink_kv(self.kv)

    def __enter__(self) -> Stored:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def in_process_server(**config: Any) -> Iterator[tuple[MPServer, MPCacheServer]]:
    """A server built in this process (its loop on a thread) from ``config``'s
    ``MPServerConfig`` fields over small defaults: a free port, a 2 MiB L1 in a fresh
    shared-memory segment, no HTTP or metrics ports.  Stopped and closed on exit."""
    fields: dict[str, Any] = {
        "port": free_port(),
        "chunk_size": CHUNK_SIZE,
        "l1_size_gb": 2 / 1024,
        "shm_name": f"lmc-test-{uuid.uuid4().hex[:8]}",
        "http_port": 0,
        "prometheus_port": 0,
    }
    settings = MPServerConfig(**(fields | config))
    engine = build_cache_server(settings)
    server = MPServer(settings, engine)
    loop = threading.Thread(target=server.serve_forever, daemon=True)
    loop.start()
    try:
        yield server, engine
    finally:
        server.request_stop()
        loop.join(15)
        server.close()  # serve_forever only drains: the sockets, context and tiers end here
