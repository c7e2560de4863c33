"""The ``lmcache server`` the server benchmark measures: started on a free local port,
ready when a client connects, stopped with SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from lmcache.v1.multiprocess.wire.curve import CurveClientKeys
from lmcache.v1.multiprocess.worker.client import MPClient, ServerUnavailableError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    args: argparse.Namespace, l1_gb: float, *extra: str, curve: CurveClientKeys | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``curve``: the client keys that reach a server started with CURVE flags."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "lmcache.cli.main", "server", "--port", str(port),
        "--supported-transfer-mode", "auto", "--chunk-size", str(args.chunk_size),
        "--l1-size-gb", f"{l1_gb:.4f}", "--max-message-mb", "2048", "--max-inflight-mb", "4096",
        "--http-port", "0", "--prometheus-port", "0",
        # L1 is sized to hold every request of the run: eviction ahead of need (default at
        # 80% full) would drop stored chunks and turn timed retrieves into misses.
        "--eviction-trigger-watermark", "1.0", *extra,
    ]  # fmt: skip
    env = dict(os.environ, LMCACHE_LOG_LEVEL="WARNING")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"tcp://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("lmcache server exited during startup")
        try:
            MPClient(url, timeout=2, connect_timeout=0.5, curve=curve).close()
            return proc, url
        except ServerUnavailableError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("lmcache server did not start")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
