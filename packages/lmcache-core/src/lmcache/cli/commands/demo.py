"""``lmcache demo``: store and retrieve real KV tensors through an MP cache server.

Connects to ``--url`` (default tcp://127.0.0.1:5555); with ``--start-server`` it first
launches ``lmcache server`` on the embedded defaults (on a free port unless ``--url`` is
given) and stops it afterwards.  For each transfer path the server allows, two workers
with their own paged KV caches take turns: one stores a request's blocks, the other looks
the prefix up and retrieves it into different blocks, and the demo checks the bytes match
exactly.  Every check is printed, a path the server refuses is reported as skipped (never
as passed); the exit status is 0 only if at least one path ran and every check passed.
With ``--start-server`` the server's own error is shown if it fails to start, and its
shared memory is released on every path.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import torch

from lmcache.v1.multiprocess.server_config import positive_int, tcp_port
from lmcache.v1.multiprocess.worker.client import (
    DEFAULT_URL,
    MPClient,
    ServerError,
    ServerUnavailableError,
    free_url,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="Store and retrieve KV tensors through an MP cache server.",
        description=__doc__,
    )
    parser.add_argument(
        "--url", type=tcp_url, default=None, help=f"server URL (default {DEFAULT_URL})"
    )
    parser.add_argument(
        "--start-server", action="store_true", help="launch `lmcache server` for the demo"
    )
    parser.add_argument(
        "--layers", type=positive_int, default=4, help="KV layers of the demo cache"
    )
    parser.add_argument(
        "--tokens", type=positive_int, default=1000, help="tokens stored and retrieved"
    )
    parser.set_defaults(func=run)


_TCP_URL = re.compile(r"^tcp://(?P<host>\[[0-9a-fA-F:.]+\]|[^:/\s]+):(?P<port>\d+)$")


def tcp_url(text: str) -> str:
    """``tcp://HOST:PORT`` with a port in 1-65535."""
    match = _TCP_URL.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a server URL like {DEFAULT_URL}")
    tcp_port(match["port"])
    return text.strip()


class _ChildServer:
    """``lmcache server`` for the demo; its stderr is kept so a failed start explains itself."""

    def __init__(self, url: str) -> None:
        port = url.rsplit(":", 1)[1]
        cmd = [sys.executable, "-m", "lmcache.cli.main", "server", "--port", port,
               "--http-port", "0", "--prometheus-port", "0"]  # fmt: skip
        env = dict(os.environ, LMCACHE_LOG_LEVEL="WARNING")
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=self._stderr)

    def error_output(self, lines: int = 20) -> str:
        self._stderr.seek(0)
        text = self._stderr.read().decode(errors="replace").strip()
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM (the server removes its shared memory), SIGKILL if it hangs; then remove
        whatever a killed server could not."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        _unlink_segments_of(self.proc.pid)
        self._stderr.close()


def _unlink_segments_of(pid: int) -> None:
    from lmcache.v1.platform.cpu.shm import SHM_DIR

    for path in Path(SHM_DIR).glob(f"lmcache_mp_{pid}_*"):
        path.unlink(missing_ok=True)


class ServerStartError(RuntimeError):
    """The demo's own server did not come up; ``output`` is what it printed."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


def _wait_for(url: str, child: _ChildServer | None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            MPClient(url, timeout=2, connect_timeout=0.5).close()
            return
        except ServerUnavailableError:
            if child is not None and child.proc.poll() is not None:
                raise ServerStartError(
                    f"lmcache server exited during start-up (status {child.proc.returncode})",
                    child.error_output(),
                ) from None
            if child is None:
                raise
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"lmcache server did not answer on {url} within {timeout:.0f} s",
                    child.error_output(),
                ) from None
            time.sleep(0.2)


def _paged_kv(layers: int, blocks: int, shm: bool, fill: bool) -> list[torch.Tensor]:
    from lmcache.v1.platform.cpu.shm import empty_shm_tensor

    shape = (2, blocks, 16, 8, 64)  # [K|V, blocks, block size, KV heads, head size]
    kv = []
    for _ in range(layers):
        t = (
            empty_shm_tensor(shape, torch.bfloat16)
            if shm
            else torch.zeros(shape, dtype=torch.bfloat16)
        )
        if fill:
            t.copy_(torch.randn(shape).to(torch.bfloat16))
        kv.append(t)
    return kv


def _release(kv: list[torch.Tensor]) -> None:
    from lmcache.v1.platform.cpu.shm import shm_segment_of, unlink_segment

    for t in kv:
        name = shm_segment_of(t)
        if name:
            unlink_segment(name)


def _check(label: str, ok: bool, failures: list[str]) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {label}")
    if not ok:
        failures.append(label)


def _demo_path(url: str, mode: str, args: argparse.Namespace, failures: list[str]) -> bool:
    """Run one transfer path; False when the server refuses it (skipped)."""
    from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

    shm = mode == "lmcache_driven"
    if shm and not _backend_declares_lmcache_driven():
        return False
    blocks = 2 * (args.tokens // 16 + 1)
    src = _paged_kv(args.layers, blocks, shm, fill=True)
    dst = _paged_kv(args.layers, blocks, shm, fill=False)
    model = f"demo-model-{mode}"
    workers: list[Any] = []
    try:
        try:
            writer = KVCacheWorker(src, model_name=model, server_url=url, mode=mode)
        except ServerError as exc:
            print(f"{mode}: SKIPPED, refused by the server ({exc.code}: {exc.message})")
            return False
        workers.append(writer)
        reader = KVCacheWorker(dst, model_name=model, server_url=url, mode=mode)
        workers.append(reader)
        path = f"{mode}" + (f", sub-path {writer.sub_path}" if writer.sub_path else "")
        print(f"{path}:")
        _round_trip(writer, reader, src, dst, blocks, args, failures)
        return True
    finally:
        for worker in workers:
            worker.close()
        _release(src + dst)


def _backend_declares_lmcache_driven() -> bool:
    """A backend without LMCache-driven transfer (engine-driven only, e.g. a minimal
    plugin) skips that path instead of failing in the worker's context factory."""
    from lmcache.v1.platform.registry import current_device_spec

    spec = current_device_spec()
    if spec.is_lmcache_driven_available():
        return True
    print(
        f"lmcache_driven: SKIPPED, backend {spec.backend_name!r} declares no LMCache-driven "
        "transfer (is_lmcache_driven_available() is False)"
    )
    return False


def _round_trip(
    writer: Any,
    reader: Any,
    src: list[torch.Tensor],
    dst: list[torch.Tensor],
    blocks: int,
    args: argparse.Namespace,
    failures: list[str],
) -> None:
    tokens = torch.randint(0, 32000, (args.tokens,)).tolist()
    n_blocks = -(-args.tokens // 16)
    src_ids = list(range(0, 2 * n_blocks, 2))  # scattered blocks
    dst_ids = list(range(blocks - 1, blocks - 1 - n_blocks, -1))
    nbytes = args.tokens * args.layers * 2 * 8 * 64 * 2
    start = time.perf_counter()
    _check(f"store {args.tokens} tokens ({nbytes / 1024**2:.1f} MiB)",
           writer.store(tokens, src_ids), failures)  # fmt: skip
    store_s = time.perf_counter() - start
    hit = reader.lookup(tokens)
    _check(f"lookup from another worker hits {hit}/{args.tokens} tokens",
           hit == args.tokens, failures)  # fmt: skip
    start = time.perf_counter()
    _check("retrieve into different blocks", reader.retrieve(tokens, dst_ids), failures)
    retrieve_s = time.perf_counter() - start
    exact = all(torch.equal(s[:, src_ids], d[:, dst_ids]) for s, d in zip(src, dst))
    _check("retrieved KV is bit-exact", exact, failures)
    other = torch.randint(0, 32000, (args.tokens,)).tolist()
    _check("unseen prompt misses", reader.lookup(other) == 0, failures)
    print(
        f"  store {nbytes / max(store_s, 1e-9) / 1e9:.2f} GB/s, "
        f"retrieve {nbytes / max(retrieve_s, 1e-9) / 1e9:.2f} GB/s"
    )


MODES = ("lmcache_driven", "engine_driven")


def run(args: argparse.Namespace) -> int:
    url = args.url or (free_url() if args.start_server else DEFAULT_URL)
    child = _ChildServer(url) if args.start_server else None
    failures: list[str] = []
    skipped: list[str] = []
    try:
        try:
            _wait_for(url, child)
        except ServerUnavailableError as exc:
            print(f"{exc}\nStart one with `lmcache server`, or run `lmcache demo --start-server`.")
            return 1
        except ServerStartError as exc:
            print(f"lmcache demo: error: {exc}; its output:", file=sys.stderr)
            print(exc.output or "(no output)", file=sys.stderr)
            return 1
        with MPClient(url) as client:
            stats = client.get_stats()
        print(
            f"LMCache server at {url}: chunk size {stats.chunk_size}, L1 "
            f"{stats.l1_capacity_bytes / 1024**3:.2f} GiB, transfer mode "
            f"{stats.supported_transfer_mode}, SHM {stats.shm_name or 'off'}"
        )
        skipped = [m for m in MODES if not _demo_path(url, m, args, failures)]
        with MPClient(url) as client:
            stats = client.get_stats()
        print(f"server counters: stored {stats.stored_tokens} tokens, retrieved "
              f"{stats.retrieved_tokens} tokens, {stats.l1_chunks} chunks in L1")  # fmt: skip
    finally:
        if child is not None:
            child.stop()
    return _verdict(failures, skipped)


def _verdict(failures: list[str], skipped: list[str]) -> int:
    ran = len(MODES) - len(skipped)
    skipped_note = f"; SKIPPED: {', '.join(skipped)}" if skipped else ""
    if failures:
        print(f"{len(failures)} check(s) FAILED{skipped_note}")
        return 1
    if ran == 0:
        print(f"nothing ran: every transfer path was refused{skipped_note}")
        return 1
    if skipped:
        print(f"checks passed on {ran} of {len(MODES)} paths{skipped_note}")
        return 0
    print("all checks passed")
    return 0
