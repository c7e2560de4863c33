"""Eviction policies side by side: hit rate and cost of one trace through the CPU tier.

One run replays the same trace through a fresh L1 tier (``LocalCPUBackend``) of
``--capacity`` chunks for every policy: a lookup that finds the chunk is a hit, a miss
stores it (evicting by the policy).  The trace is a hot working set (``--hot`` chunks
reused at random, ``--reuse`` lookups per round) interleaved with one-pass scans of
``--scan`` chunks never seen again: long unrelated prompts streaming through a shared
cache.  Policies run interleaved, round after round (``--repeats``), so machine load hits
them alike; times are medians, and each policy's time is also given as a ratio to LRU's.
``us/miss`` is the run's time over its misses (a miss stores a chunk and evicts one, which
is where a policy spends its time; hits cost about the same under every policy).
``noop`` is left out (it refuses stores once full, so it has no steady state).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from lmcache.bench._output import add_output_arguments, write_json
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import CACHE_POLICIES, LMCacheEngineConfig
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

DTYPE = torch.half
DEFAULT_POLICIES = [p for p in CACHE_POLICIES if p != "noop"]


@dataclass
class Row:
    policy: str
    lookups: int
    hit_rate: float
    evictions: int
    seconds: float
    lookups_per_s: float
    us_per_miss: float
    time_vs_lru: float = 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policies",
        nargs="+",
        default=DEFAULT_POLICIES,
        choices=DEFAULT_POLICIES,
        help="policies to compare (default: all but noop)",
    )
    parser.add_argument("--capacity", type=int, default=64, help="L1 size in chunks")
    parser.add_argument("--hot", type=int, default=48, help="chunks in the reused set")
    parser.add_argument("--reuse", type=int, default=200, help="hot lookups per round")
    parser.add_argument("--scan", type=int, default=100, help="one-off chunks per round")
    parser.add_argument("--rounds", type=int, default=20, help="rounds in the trace")
    parser.add_argument("--chunk-kib", type=int, default=64, help="chunk size (KiB)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per policy (median)")
    parser.add_argument("--seed", type=int, default=0, help="trace seed")
    add_output_arguments(parser)


def scan_polluted_trace(args: argparse.Namespace) -> list[int]:
    rng = random.Random(args.seed)
    trace: list[int] = []
    fresh = 1 << 40
    for _ in range(args.rounds):
        trace += [rng.randrange(args.hot) for _ in range(args.reuse)]
        trace += range(fresh, fresh + args.scan)
        fresh += args.scan
    return trace


def replay(policy: str, trace: list[int], args: argparse.Namespace) -> tuple[int, int, float]:
    """(hits, evictions, seconds) of ``trace`` through a fresh tier with ``policy``."""
    chunk_bytes = args.chunk_kib * 1024
    shape = torch.Size([chunk_bytes // 2])
    config = LMCacheEngineConfig.from_defaults(
        max_local_cpu_size=f"{args.capacity * args.chunk_kib}KiB",
        cache_policy=policy,
        blocking_timeout_secs=1,
    )
    cpu = LocalCPUBackend(config)
    hits = 0
    try:
        start = time.perf_counter()
        for chunk in trace:
            key = CacheEngineKey("bench", 1, 0, chunk, DTYPE)
            obj = cpu.get_blocking(key)
            if obj is not None:
                hits += 1
                obj.ref_count_down()
                continue
            new = cpu.allocate(shape, DTYPE, busy_loop=False)
            if new is not None:
                cpu.batched_submit_put_task([key], [new])
                new.ref_count_down()
        seconds = time.perf_counter() - start
        return hits, cpu.evictions, seconds
    finally:
        cpu.close()


def measure(args: argparse.Namespace) -> list[Row]:
    trace = scan_polluted_trace(args)
    times: dict[str, list[float]] = {p: [] for p in args.policies}
    outcome: dict[str, tuple[int, int]] = {}
    for _ in range(args.repeats):
        for policy in args.policies:  # interleaved: load hits every policy alike
            hits, evictions, seconds = replay(policy, trace, args)
            times[policy].append(seconds)
            outcome[policy] = (hits, evictions)
    rows = []
    for policy in args.policies:
        seconds = statistics.median(times[policy])
        hits, evictions = outcome[policy]
        misses = max(1, len(trace) - hits)
        rows.append(
            Row(
                policy,
                len(trace),
                hits / len(trace),
                evictions,
                seconds,
                len(trace) / seconds,
                seconds / misses * 1e6,
            )
        )
    lru = next((r.seconds for r in rows if r.policy == "LRU"), None)
    for row in rows:
        row.time_vs_lru = row.seconds / lru if lru else 0.0
    return rows


def _print(rows: list[Row], args: argparse.Namespace) -> None:
    print(
        f"trace: {args.rounds} rounds of {args.reuse} lookups over {args.hot} hot chunks + "
        f"{args.scan} one-off chunks; L1 {args.capacity} chunks of {args.chunk_kib} KiB; "
        f"best possible hit rate {args.reuse / (args.reuse + args.scan):.3f}"
    )
    header = (
        f"{'policy':<12} {'hit rate':>8} {'evictions':>9} {'lookups/s':>10} "
        f"{'us/miss':>8} {'time/LRU':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.policy:<12} {r.hit_rate:>8.3f} {r.evictions:>9} {r.lookups_per_s:>10,.0f} "
            f"{r.us_per_miss:>8.1f} {r.time_vs_lru:>8.2f}"
        )


def run(args: argparse.Namespace) -> int:
    for name in ("capacity", "hot", "reuse", "scan", "rounds", "chunk_kib", "repeats"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be positive")
    if args.plot:
        raise SystemExit("bench eviction draws no chart; use --json")
    rows = measure(args)
    _print(rows, args)
    if args.json:
        write_json(args.json, "eviction", args, [asdict(r) for r in rows])
    return 0
