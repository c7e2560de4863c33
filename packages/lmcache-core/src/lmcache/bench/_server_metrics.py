"""``lmcache bench server --metrics-overhead``: a metered and an unmetered server in
alternating rounds (drift on a shared machine hits both alike), medians per path."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

from lmcache.bench._output import plot_bars, write_json
from lmcache.bench._server_measure import RunProgress, measure, run_sizes
from lmcache.bench._server_process import start_server, stop_server


def run_metrics_overhead(
    args: argparse.Namespace, paths: Sequence[tuple[str, str | None, str]]
) -> int:
    """Alternate rounds between a metered and an unmetered server; medians per path."""
    _, request_bytes, l1_gb = run_sizes(args, 1, args.rounds * 2)
    bar = RunProgress(len(paths) * args.rounds * 2 * 2 * (args.iters + 1))
    servers = {
        "metrics": start_server(args, l1_gb),
        "no-metrics": start_server(args, l1_gb, "--disable-metrics"),
    }
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for mode, sub, label in paths:
            for rnd in range(args.rounds):
                # Swap the order every round: neither server is always second.
                order = list(servers) if rnd % 2 == 0 else list(reversed(servers))
                for name in order:
                    store, retrieve = measure(
                        args, servers[name][1], mode, sub, 1, bar, f"{label} {name}"
                    )
                    # store+retrieve throughput: bytes both ways over the time of both
                    both = 2 / (1 / store + 1 / retrieve)
                    samples.setdefault((label, name), []).append(both)
    finally:
        bar.close()
        for proc, _url in servers.values():
            stop_server(proc)
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
