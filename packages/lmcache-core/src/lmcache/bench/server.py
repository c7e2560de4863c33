"""MP cache server store/retrieve throughput per transfer path, 1 and N workers, vs memcpy.

Starts ``lmcache server --supported-transfer-mode auto`` on a free local port, then for
each path (engine-driven SHM, engine-driven inline, LMCache-driven CPU SHM) and each
worker count, stores fresh chunks from paged KV caches and retrieves them into other
blocks, timing whole requests as a client sees them (wall clock, all workers together).
The reference is one ``torch`` copy of the same bytes in this process (the memcpy bound).

``--metrics-overhead`` instead starts two servers, one with ``--disable-metrics``, and
alternates timed rounds between them (store + retrieve, one worker per path), so drift on a
shared machine hits both alike; it reports the throughput of each and how far apart they are.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from lmcache.bench._output import (
    add_output_arguments,
    plot_bars,
    progress,
    require_matplotlib,
    write_json,
)
from lmcache.v1.multiprocess.worker.client import MPClient, ServerUnavailableError
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

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
    parser.add_argument(
        "--metrics-overhead",
        action="store_true",
        help="compare a server with metrics against one with --disable-metrics",
    )
    parser.add_argument(
        "--rounds", type=int, default=7, help="alternating rounds of --metrics-overhead"
    )
    add_output_arguments(parser)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_server(
    args: argparse.Namespace, l1_gb: float, *extra: str
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [
        sys.executable, "-m", "lmcache.cli.main", "server", "--port", str(port),
        "--supported-transfer-mode", "auto", "--chunk-size", str(args.chunk_size),
        "--l1-size-gb", f"{l1_gb:.4f}", "--max-message-mb", "2048",
        "--http-port", "0", "--prometheus-port", "0", *extra,
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
    """One bar for the whole run; requests of all worker threads advance it."""

    def __init__(self, total: int) -> None:
        self._bar = progress(total, "bench server")
        self._lock = threading.Lock()

    def step(self, label: str) -> None:
        with self._lock:
            self._bar.set_description_str(label)
            self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


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

    results: list[float] = []
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


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _sizes(args: argparse.Namespace, workers: int, rounds: int = 1) -> tuple[int, int, float]:
    """(chunk bytes, request bytes, L1 GiB holding every request of the run)."""
    chunk_bytes = 2 * args.num_layers * args.chunk_size * args.num_heads * args.head_size
    chunk_bytes *= DTYPES[args.dtype].itemsize
    request_bytes = chunk_bytes * args.chunks
    footprint = request_bytes * (args.iters + 1) * workers * rounds
    return chunk_bytes, request_bytes, max(0.0625, 1.25 * footprint / 1024**3)


def run(args: argparse.Namespace) -> int:
    if args.plot:
        require_matplotlib()  # fail before measuring, not after
    _apply_quick(args)
    logging.getLogger("lmcache").setLevel(logging.WARNING)  # keep the progress bar readable
    wanted = {"engine-shm": 0, "engine-inline": 1, "lmcache-driven": 2}
    paths = [PATHS[wanted[p]] for p in args.paths]
    if args.metrics_overhead:
        return _run_metrics_overhead(args, paths)
    chunk_bytes, request_bytes, l1_gb = _sizes(args, max(args.workers))
    memcpy = _memcpy_gbps(request_bytes)
    bar = _Progress(sum(2 * (args.iters + 1) * w for w in args.workers) * len(paths))
    proc, url = _start_server(args, l1_gb)
    rows: list[Row] = []
    try:
        for mode, sub, label in paths:
            for workers in args.workers:
                store, retrieve = _measure(args, url, mode, sub, workers, bar, label)
                rows.append(Row(label, workers, chunk_bytes, store, retrieve, memcpy))
    finally:
        bar.close()
        _stop(proc)
    _print_table(rows, request_bytes)
    raw_zmq = _inline_vs_raw_zmq(args, rows, chunk_bytes)
    if args.json:
        results = [asdict(r) | _ratios(r) for r in rows]
        write_json(args.json, "server", args, results, **({"raw_zmq": raw_zmq} if raw_zmq else {}))
    if args.plot:
        _plot(rows, args.plot)
    return 0


def _run_metrics_overhead(
    args: argparse.Namespace, paths: Sequence[tuple[str, str | None, str]]
) -> int:
    """Alternate rounds between a metered and an unmetered server; medians per path."""
    _, request_bytes, l1_gb = _sizes(args, 1, args.rounds * 2)
    bar = _Progress(len(paths) * args.rounds * 2 * 2 * (args.iters + 1))
    servers = {
        "metrics": _start_server(args, l1_gb),
        "no-metrics": _start_server(args, l1_gb, "--disable-metrics"),
    }
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for mode, sub, label in paths:
            for rnd in range(args.rounds):
                # Swap the order every round: neither server is always second.
                order = list(servers) if rnd % 2 == 0 else list(reversed(servers))
                for name in order:
                    store, retrieve = _measure(
                        args, servers[name][1], mode, sub, 1, bar, f"{label} {name}"
                    )
                    # store+retrieve throughput: bytes both ways over the time of both
                    both = 2 / (1 / store + 1 / retrieve)
                    samples.setdefault((label, name), []).append(both)
    finally:
        bar.close()
        for proc, _url in servers.values():
            _stop(proc)
    results: list[dict[str, Any]] = []
    for _mode, _sub, label in paths:
        on, off = samples[(label, "metrics")], samples[(label, "no-metrics")]
        # Paired per round (the two runs of a round saw the same machine load).
        ratio = statistics.median(a / b for a, b in zip(on, off))
        results.append(
            {
                "path": label,
                "metrics_gbps": statistics.median(on),
                "no_metrics_gbps": statistics.median(off),
                "ratio": ratio,
                "overhead_pct": 100 * (1 - ratio),
            }
        )
    print(
        f"store+retrieve GB/s, median of {args.rounds} alternating rounds per server; "
        "ratio = median of the per-round ratios, "
        f"request {request_bytes / 1024**2:.1f} MiB"
    )
    header = f"{'path':<26} {'metrics':>9} {'no metrics':>11} {'ratio':>7} {'overhead %':>11}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['path']:<26} {r['metrics_gbps']:>9.2f} {r['no_metrics_gbps']:>11.2f} "
            f"{r['ratio']:>7.3f} {r['overhead_pct']:>11.2f}"
        )
    worst = max(abs(r["overhead_pct"]) for r in results)
    print(f"largest difference: {worst:.2f}% (budget 3%)")
    if args.json:
        write_json(
            args.json, "server-metrics-overhead", args, results, summary={"max_abs_pct": worst}
        )
    if args.plot:
        plot_bars(
            args.plot,
            "MP server store+retrieve: metrics on vs --disable-metrics",
            [r["path"] for r in results],
            {
                "metrics": [r["metrics_gbps"] for r in results],
                "no metrics": [r["no_metrics_gbps"] for r in results],
            },
            {"metrics / no metrics": [r["ratio"] for r in results]},
            "ratio",
        )
    return 0


def _inline_vs_raw_zmq(
    args: argparse.Namespace, rows: list[Row], chunk_bytes: int
) -> list[dict[str, Any]]:
    """The inline rows against raw ZeroMQ moving the same frames in this run (printed)."""
    from lmcache.bench._zmq_reference import measure

    inline = [r for r in rows if r.path == PATHS[1][2]]
    if not inline:
        return []
    ref = measure(chunk_bytes, args.chunks, args.iters)
    print(
        f"raw ZeroMQ reference (same frames, loopback): store {ref.store_gbps:.2f} GB/s, "
        f"retrieve {ref.retrieve_gbps:.2f} GB/s"
    )
    out = []
    for r in inline:
        store_x, retrieve_x = r.store_gbps / ref.store_gbps, r.retrieve_gbps / ref.retrieve_gbps
        print(f"{r.path} x{r.workers}: store {store_x:.2f}x, retrieve {retrieve_x:.2f}x raw ZMQ")
        out.append(
            {
                "path": f"{r.path} vs raw ZMQ",
                "workers": r.workers,
                "zmq_store_gbps": ref.store_gbps,
                "zmq_retrieve_gbps": ref.retrieve_gbps,
                "store_x_zmq": store_x,
                "retrieve_x_zmq": retrieve_x,
            }
        )
    return out


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
    labels = [f"{r.path} x{r.workers}" for r in rows]
    plot_bars(
        path,
        "MP server throughput per transfer path",
        labels,
        {
            "store": [r.store_gbps for r in rows],
            "retrieve": [r.retrieve_gbps for r in rows],
            "memcpy": [r.memcpy_gbps for r in rows],
        },
        {
            "store / memcpy": [r.store_ratio for r in rows],
            "retrieve / memcpy": [r.retrieve_ratio for r in rows],
        },
        "x memcpy",
    )
