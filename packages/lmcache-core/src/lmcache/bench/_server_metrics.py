"""Paired server comparisons of ``lmcache bench server``: two servers that differ in one
setting, measured in alternating rounds (drift on a shared machine hits both alike),
medians per path and the median of the per-round ratios.

* ``--metrics-overhead``: a metered server against one with ``--disable-metrics``;
* ``--curve``: a server with CURVE keys (encrypted, authenticated) against a plaintext one.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmcache.bench._output import plot_bars, write_json
from lmcache.bench._server_measure import RunProgress, measure, run_sizes
from lmcache.bench._server_process import start_server, stop_server
from lmcache.v1.multiprocess.wire.curve import CurveClientKeys, write_key_pair


@dataclasses.dataclass(frozen=True)
class Variant:
    """One of the two servers: its name, extra flags and the keys its clients use."""

    name: str
    flags: tuple[str, ...] = ()
    curve: CurveClientKeys | None = None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What a paired run compares: the treated server first, the baseline second."""

    kind: str  # the JSON "kind" and the title
    treated: Variant
    baseline: Variant
    budget_pct: float | None = None


def run_metrics_overhead(
    args: argparse.Namespace, paths: Sequence[tuple[str, str | None, str]]
) -> int:
    comparison = Comparison(
        "server-metrics-overhead",
        Variant("metrics"),
        Variant("no-metrics", ("--disable-metrics",)),
        budget_pct=3.0,
    )
    return run_paired(args, paths, comparison)


def run_curve_overhead(
    args: argparse.Namespace, paths: Sequence[tuple[str, str | None, str]]
) -> int:
    """CURVE against plaintext; keys are made for the run in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="lmcache-bench-keys-") as root:
        folder = Path(root)
        server_public, server_secret = write_key_pair(folder / "server", "server")
        _public, client_secret = write_key_pair(folder / "authorized", "bench")
        keys = CurveClientKeys.from_files(client_secret, server_public)
        flags = (
            "--curve-secret-key-file", str(server_secret),
            "--authorized-keys", str(folder / "authorized"),
        )  # fmt: skip
        comparison = Comparison(
            "server-curve-overhead", Variant("curve", flags, keys), Variant("plaintext")
        )
        return run_paired(args, paths, comparison)


def run_paired(
    args: argparse.Namespace,
    paths: Sequence[tuple[str, str | None, str]],
    comparison: Comparison,
) -> int:
    """Alternate rounds between the two servers; medians per path."""
    _, request_bytes, l1_gb = run_sizes(args, 1, args.rounds * 2)
    bar = RunProgress(len(paths) * args.rounds * 2 * 2 * (args.iters + 1))
    variants = {v.name: v for v in (comparison.treated, comparison.baseline)}
    servers = {
        name: start_server(args, l1_gb, *v.flags, curve=v.curve) for name, v in variants.items()
    }
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for mode, sub, label in paths:
            for rnd in range(args.rounds):
                # Swap the order every round: neither server is always second.
                order = list(servers) if rnd % 2 == 0 else list(reversed(servers))
                for name in order:
                    store, retrieve = measure(
                        args, servers[name][1], mode, sub, 1, bar, f"{label} {name}",
                        curve=variants[name].curve,
                    )  # fmt: skip
                    # store+retrieve throughput: bytes both ways over the time of both
                    both = 2 / (1 / store + 1 / retrieve)
                    samples.setdefault((label, name), []).append(both)
    finally:
        bar.close()
        for proc, _url in servers.values():
            stop_server(proc)
    results = _paired_results(paths, samples, comparison)
    _report(args, results, request_bytes, comparison)
    return 0


def _paired_results(
    paths: Sequence[tuple[str, str | None, str]],
    samples: dict[tuple[str, str], list[float]],
    comparison: Comparison,
) -> list[dict[str, Any]]:
    treated, baseline = comparison.treated.name, comparison.baseline.name
    results: list[dict[str, Any]] = []
    for _mode, _sub, label in paths:
        on, off = samples[(label, treated)], samples[(label, baseline)]
        # Paired per round (the two runs of a round saw the same machine load).
        ratio = statistics.median(a / b for a, b in zip(on, off))
        results.append(
            {
                "path": label,
                f"{treated.replace('-', '_')}_gbps": statistics.median(on),
                f"{baseline.replace('-', '_')}_gbps": statistics.median(off),
                "ratio": ratio,
                "overhead_pct": 100 * (1 - ratio),
            }
        )
    return results


def _report(
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    request_bytes: int,
    comparison: Comparison,
) -> None:
    treated, baseline = comparison.treated.name, comparison.baseline.name
    on_key, off_key = f"{treated.replace('-', '_')}_gbps", f"{baseline.replace('-', '_')}_gbps"
    print(
        f"store+retrieve GB/s, median of {args.rounds} alternating rounds per server; "
        "ratio = median of the per-round ratios, "
        f"request {request_bytes / 1024**2:.1f} MiB"
    )
    header = f"{'path':<26} {treated:>11} {baseline:>11} {'ratio':>7} {'overhead %':>11}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['path']:<26} {r[on_key]:>11.2f} {r[off_key]:>11.2f} "
            f"{r['ratio']:>7.3f} {r['overhead_pct']:>11.2f}"
        )
    worst = max(abs(r["overhead_pct"]) for r in results)
    budget = f" (budget {comparison.budget_pct:g}%)" if comparison.budget_pct is not None else ""
    print(f"largest difference: {worst:.2f}%{budget}")
    if args.json:
        write_json(args.json, comparison.kind, args, results, summary={"max_abs_pct": worst})
    if args.plot:
        plot_bars(
            args.plot,
            f"MP server store+retrieve: {treated} vs {baseline}",
            [r["path"] for r in results],
            {treated: [r[on_key] for r in results], baseline: [r[off_key] for r in results]},
            {f"{treated} / {baseline}": [r["ratio"] for r in results]},
            "ratio",
        )
