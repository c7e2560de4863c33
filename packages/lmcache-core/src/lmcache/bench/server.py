"""MP cache server store/retrieve throughput per transfer path, 1 and N workers, vs memcpy.

Starts ``lmcache server --supported-transfer-mode auto`` on a free local port, then for
each path (engine-driven SHM, engine-driven inline, LMCache-driven CPU SHM) and each
worker count, stores fresh chunks from paged KV caches and retrieves them into other
blocks, timing whole requests as a client sees them (wall clock, all workers together).
The reference is one ``torch`` copy of the same bytes in this process (the memcpy bound).

``--metrics-overhead`` instead starts two servers, one with ``--disable-metrics``, and
alternates timed rounds between them (store + retrieve, one worker per path), so drift on a
shared machine hits both alike; it reports the throughput of each and how far apart they are.
``--curve`` does the same with a server with CURVE keys against a plaintext one (the cost
of encryption: ``--paths engine-inline`` is the path whose KV bytes cross the wire).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, dataclass
from typing import Any

from lmcache.bench._output import (
    add_output_arguments,
    plot_bars,
    require_matplotlib,
    write_json,
)
from lmcache.bench._server_measure import (
    DTYPES,
    RunProgress,
    measure,
    memcpy_gbps,
    parallel_memcpy_gbps,
    run_sizes,
)
from lmcache.bench._server_metrics import run_curve_overhead, run_metrics_overhead
from lmcache.bench._server_process import start_server, stop_server

PATHS = (
    ("engine_driven", "shm", "engine-driven SHM"),
    ("engine_driven", "inline", "engine-driven inline"),
    ("lmcache_driven", None, "LMCache-driven (CPU SHM)"),
)


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
    parser.add_argument("--num-layers", type=int, default=8, help="KV layers of the model")
    parser.add_argument("--num-heads", type=int, default=4, help="KV heads per layer")
    parser.add_argument("--head-size", type=int, default=64, help="elements per head")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per paged block")
    parser.add_argument("--chunk-size", type=int, default=256, help="tokens per chunk")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="KV element type")
    parser.add_argument("--chunks", type=int, default=8, help="chunks per request")
    parser.add_argument("--iters", type=int, default=4, help="timed requests per worker")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, 2, 4],
        help="worker counts to measure (aggregate throughput; printed as a scaling table)",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=["engine-shm", "engine-inline", "lmcache-driven"],
        default=["engine-shm", "engine-inline", "lmcache-driven"],
        help="transfer paths to measure (default: all three)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument(
        "--metrics-overhead",
        action="store_true",
        help="compare a server with metrics against one with --disable-metrics",
    )
    parser.add_argument(
        "--curve",
        action="store_true",
        help="compare a server with CURVE keys (encrypted, authenticated wire) against a "
        "plaintext one, in alternating rounds (the inline path carries the KV bytes over "
        "the wire; the SHM paths only their control messages)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=7,
        help="alternating rounds of --metrics-overhead and --curve",
    )
    add_output_arguments(parser)


def _apply_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.num_layers, args.num_heads, args.head_size = 2, 2, 16
        args.chunk_size, args.block_size, args.chunks, args.iters = 32, 8, 2, 2
        args.workers = [1, 2]


def run(args: argparse.Namespace) -> int:
    if args.plot:
        require_matplotlib()  # fail before measuring, not after
    _apply_quick(args)
    logging.getLogger("lmcache").setLevel(logging.WARNING)  # keep the progress bar readable
    wanted = {"engine-shm": 0, "engine-inline": 1, "lmcache-driven": 2}
    paths = [PATHS[wanted[p]] for p in args.paths]
    if args.metrics_overhead and args.curve:
        raise ValueError("give --metrics-overhead or --curve, not both")
    if args.metrics_overhead:
        return run_metrics_overhead(args, paths)
    if args.curve:
        return run_curve_overhead(args, paths)
    chunk_bytes, request_bytes, l1_gb = run_sizes(args, max(args.workers))
    started = _run_conditions()
    print(
        f"device ops {started['device_ops']}, torch threads {started['torch_threads']}, "
        f"load average {started['load_average']}"
    )
    memcpy = memcpy_gbps(request_bytes)
    bar = RunProgress(sum(2 * (args.iters + 1) * w for w in args.workers) * len(paths))
    proc, url = start_server(args, l1_gb)
    rows: list[Row] = []
    try:
        for mode, sub, label in paths:
            for workers in args.workers:
                store, retrieve = measure(args, url, mode, sub, workers, bar, label)
                rows.append(Row(label, workers, chunk_bytes, store, retrieve, memcpy))
    finally:
        bar.close()
        stop_server(proc)
    _print_table(rows, request_bytes)
    scaling = _scaling(rows, args.workers, request_bytes)
    raw_zmq = _inline_vs_raw_zmq(args, rows, chunk_bytes)
    if args.json:
        results = [asdict(r) | _ratios(r) for r in rows]
        extra: dict[str, Any] = {"scaling": scaling} if scaling else {}
        extra["conditions"] = {"start": started, "end": _run_conditions()}
        if raw_zmq:
            extra["raw_zmq"] = raw_zmq
        write_json(args.json, "server", args, results, **extra)
    if args.plot:
        _plot(rows, args.plot)
    return 0


def _run_conditions() -> dict[str, Any]:
    """The machine, and which KV copy kernels the worker (and a server started from this
    interpreter) use: the torch baseline or a plugin's native ops."""
    import torch

    from lmcache.bench._vllm_cpu import conditions
    from lmcache.v1.platform import resolve_device_ops

    ops = type(resolve_device_ops("cpu"))
    return {
        **conditions(),
        "device_ops": f"{ops.__module__}.{ops.__qualname__}",
        "torch_threads": torch.get_num_threads(),
    }


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


def _scaling(rows: list[Row], counts: list[int], request_bytes: int) -> list[dict[str, Any]]:
    """Aggregate GB/s per path and worker count next to N threads copying the same bytes
    (measured now, after the paths): printed side by side, returned for the JSON."""
    counts = sorted(set(counts))
    if len(counts) < 2:
        return []
    memcpy = {n: parallel_memcpy_gbps(request_bytes, n) for n in counts}
    cells = "".join(f" {f'x{n} st/rt GB/s':>17}" for n in counts)
    print(f"\nscaling (aggregate of all workers){cells}")
    print(f"{'memcpy, N threads':<34}" + "".join(f" {memcpy[n]:>17.2f}" for n in counts))
    out: list[dict[str, Any]] = []
    for path in dict.fromkeys(r.path for r in rows):
        by_count = {r.workers: r for r in rows if r.path == path}
        line = ""
        for n in counts:
            row = by_count.get(n)
            line += f" {f'{row.store_gbps:.2f}/{row.retrieve_gbps:.2f}' if row else '-':>17}"
            if row is not None:
                out.append(
                    {
                        "path": path,
                        "workers": n,
                        "store_gbps": row.store_gbps,
                        "retrieve_gbps": row.retrieve_gbps,
                        "memcpy_threads_gbps": memcpy[n],
                        "store_x_memcpy_threads": row.store_gbps / memcpy[n],
                        "retrieve_x_memcpy_threads": row.retrieve_gbps / memcpy[n],
                    }
                )
        print(f"{path:<34}{line}")
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
