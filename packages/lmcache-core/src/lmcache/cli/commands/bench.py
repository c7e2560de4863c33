"""``lmcache bench <name>``: run one of the benchmarks in :mod:`lmcache.bench`."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from typing import Any

from lmcache import bench


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="Run a benchmark (ratios against baseline and memcpy bound, side by side).",
        description="Run a benchmark. Every benchmark measures side by side in one run.",
    )
    bench_subparsers = parser.add_subparsers(dest="bench_name", metavar="BENCHMARK")
    for module_info in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{bench.__name__}.{module_info.name}")
        doc = (module.__doc__ or module_info.name).strip().splitlines()[0]
        sub = bench_subparsers.add_parser(module_info.name, help=doc, description=module.__doc__)
        module.add_arguments(sub)
        sub.set_defaults(func=module.run)
    parser.set_defaults(func=_missing_benchmark(parser))


def _missing_benchmark(parser: argparse.ArgumentParser) -> Any:
    def run(_args: argparse.Namespace) -> int:
        parser.print_help()  # a bare `lmcache bench` lists the benchmarks, like `lmcache`
        return 0

    return run
