"""MP cache server store/retrieve throughput per transfer path, 1 and N workers, vs memcpy.

Starts ``lmcache server --supported-transfer-mode auto`` on a free local port, then for
each path (engine-driven SHM, engine-driven inline, LMCache-driven CPU SHM) and each
worker count, stores fresh chunks from paged KV caches and retrieves them into other
blocks, timing whole requests as a client sees them (wall clock, all workers together).
The reference is one ``torch`` copy of the same bytes in this process (the memcpy bound).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from lmcache.v1.multiprocess.client import MPClient, ServerUnavailableError
from lmcache.v1.multiprocess.worker import KVCacheWorker

PATHS = (
    ("engine_driven", "shm", "engine-driven SHM"),
    ("engine_driven", "inline", "engine-driven inline"),
    ("lmcache_driven", None, "LMCache-driven (CPU SHM)"),
)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class Row:
    path: str
    workers: int
    chunk_bytes: int
    store_gbps: float
    retrieve_gbps: float
    memcpy_gbps: float

    @property
    def store_ratio(self) -> float:
        return self.store_gbps / self.memcpy_gbps

    @property
    def retrieve_ratio(self) -> float:
        return self.retrieve_gbps / self.memcpy_gbps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--chunk-size", type=int, default=256, help="tokens per chunk")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--chunks", type=int, default=8, help="chunks per request")
    parser.add_argument("--iters", type=int, default=4, help="timed requests per worker")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=["engine-shm", "engine-inline", "lmcache-driven"],
        default=["engine-shm", "engine-inline", "lmcache-driven"],
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument("--plot", metavar="PNG", help="also plot (needs matplotlib)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_server(args: argparse.Namespace, l1_gb: float) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [
        sys.executable, "-m", "lmcache.cli.main", "server", "--port", str(port),
        "--supported-transfer-mode", "auto", "--chunk-size", str(args.chunk_size),
        "--l1-size-gb", f"{l1_gb:.4f}", "--max-message-mb", "2048",
    ]  # fmt: skip
    env = dict(os.environ, LMCACHE_LOG_LEVEL="WARNING")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"tcp://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("lmcache server exited during startup")
        try:
            MPClient(url, timeout=2, connect_timeout=0.5).close()
            return proc, url
        except ServerUnavailableError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("lmcache server did not start")


class _Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        self._lock = threading.Lock()

    def step(self, label: str) -> None:
        with self._lock:
            self.done += 1
            filled = int(30 * self.done / self.total)
            bar = "#" * filled + "." * (30 - filled)
            print(f"\r[{bar}] {self.done}/{self.total} {label:<34}", end="", file=sys.stderr)
            if self.done == self.total:
                print(file=sys.stderr)


def _kv(args: argparse.Namespace, num_blocks: int, shm: bool) -> list[torch.Tensor]:
    from lmcache.v1.platform.cpu.shm import empty_shm_tensor

    shape = (2, num_blocks, args.block_size, args.num_heads, args.head_size)
    dtype = DTYPES[args.dtype]
    layers = []
    for _ in range(args.num_layers):
        tensor = empty_shm_tensor(shape, dtype) if shm else torch.empty(shape, dtype=dtype)
        tensor.copy_(torch.randn(shape).to(dtype))
        layers.append(tensor)
    return layers


def _memcpy_gbps(nbytes: int, repeats: int = 5) -> float:
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def _measure(
    args: argparse.Namespace, url: str, mode: str, sub: str | None, workers: int,
    progress: _Progress, label: str,
) -> tuple[float, float]:  # fmt: skip
    blocks_per_request = args.chunks * args.chunk_size // args.block_size
    shm = mode == "lmcache_driven"
    caches = [_kv(args, 2 * blocks_per_request, shm) for _ in range(workers)]
    model = f"bench-{mode}-{sub}-{workers}-{time.monotonic_ns()}"
    clients = [
        KVCacheWorker(kv, model_name=model, server_url=url, mode=mode, sub_path=sub, timeout=120)
        for kv in caches
    ]
    tokens_per_request = args.chunks * args.chunk_size
    store_ids = list(range(blocks_per_request))
    load_ids = list(range(blocks_per_request, 2 * blocks_per_request))
    barrier = threading.Barrier(workers + 1)
    failures: list[BaseException] = []

    def tokens(w: int, i: int) -> list[int]:
        base = (w * 1000 + i + 1) * 10_000_000
        return list(range(base, base + tokens_per_request))

    def run(w: int, phase: str) -> None:
        try:
            barrier.wait()
            for i in range(args.iters + 1):  # request 0 warms up (not timed)
                if phase == "store":
                    ok = clients[w].store(tokens(w, i), store_ids)
                else:
                    ok = clients[w].retrieve(tokens(w, i), load_ids)
                if not ok:
                    raise RuntimeError(f"{phase} failed")
                if i == 0:
                    barrier.wait()
                progress.step(f"{label} x{workers} {phase}")
            barrier.wait()
        except BaseException as exc:
            failures.append(exc)
            barrier.abort()

    results = []
    layout = clients[0].context.layout if clients[0].context is not None else None
    assert layout is not None
    bytes_per_token = layout.bytes_per_token()
    try:
        for phase in ("store", "retrieve"):
            threads = [threading.Thread(target=run, args=(w, phase)) for w in range(workers)]
            for t in threads:
                t.start()
            barrier.wait()  # start
            barrier.wait()  # warm-up done
            start = time.perf_counter()
            barrier.wait()  # all timed requests done
            elapsed = time.perf_counter() - start
            for t in threads:
                t.join()
            if failures:
                raise failures[0]
            nbytes = workers * args.iters * tokens_per_request * bytes_per_token
            results.append(nbytes / elapsed / 1e9)
    finally:
        for client in clients:
            client.close()
    return results[0], results[1]


def _apply_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.num_layers, args.num_heads, args.head_size = 2, 2, 16
        args.chunk_size, args.block_size, args.chunks, args.iters = 32, 8, 2, 2
        args.workers = [1, 2]


def run(args: argparse.Namespace) -> int:
    _apply_quick(args)
    logging.getLogger("lmcache").setLevel(logging.WARNING)  # keep the progress bar readable
    wanted = {"engine-shm": 0, "engine-inline": 1, "lmcache-driven": 2}
    paths = [PATHS[wanted[p]] for p in args.paths]
    dtype = DTYPES[args.dtype]
    chunk_bytes = 2 * args.num_layers * args.chunk_size * args.num_heads * args.head_size
    chunk_bytes *= dtype.itemsize
    request_bytes = chunk_bytes * args.chunks
    footprint = request_bytes * (args.iters + 1) * max(args.workers)
    l1_gb = max(0.0625, 1.25 * footprint / 1024**3)
    memcpy = _memcpy_gbps(request_bytes)
    total = sum(2 * (args.iters + 1) * w for w in args.workers) * len(paths)
    progress = _Progress(total)
    proc, url = _start_server(args, l1_gb)
    rows: list[Row] = []
    try:
        for mode, sub, label in paths:
            for workers in args.workers:
                store, retrieve = _measure(args, url, mode, sub, workers, progress, label)
                rows.append(Row(label, workers, chunk_bytes, store, retrieve, memcpy))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    _print_table(rows, request_bytes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) | _ratios(r) for r in rows], f, indent=2)
    if args.plot:
        _plot(rows, args.plot)
    return 0


def _ratios(row: Row) -> dict[str, float]:
    return {"store_ratio": row.store_ratio, "retrieve_ratio": row.retrieve_ratio}


def _print_table(rows: list[Row], request_bytes: int) -> None:
    mib = rows[0].chunk_bytes / 1024**2 if rows else 0
    print(
        f"chunk {mib:.2f} MiB, request {request_bytes / 1024**2:.1f} MiB; "
        f"memcpy of one request {rows[0].memcpy_gbps:.2f} GB/s"
        if rows
        else "no results"
    )
    header = (
        f"{'path':<26} {'workers':>7} {'store GB/s':>11} {'x memcpy':>9} "
        f"{'retrieve GB/s':>14} {'x memcpy':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.path:<26} {r.workers:>7} {r.store_gbps:>11.2f} {r.store_ratio:>9.2f} "
            f"{r.retrieve_gbps:>14.2f} {r.retrieve_ratio:>9.2f}"
        )


def _plot(rows: list[Row], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed; no plot written")
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r.path}\nx{r.workers}" for r in rows]
    xs: Any = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r.store_gbps for r in rows], 0.4, label="store")
    ax.bar([x + 0.2 for x in xs], [r.retrieve_gbps for r in rows], 0.4, label="retrieve")
    ax.axhline(rows[0].memcpy_gbps, color="gray", linestyle="--", label="memcpy")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("GB/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
