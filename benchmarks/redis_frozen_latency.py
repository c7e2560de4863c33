"""Lookup and store latency of the Redis tier with Redis healthy, then frozen (SIGSTOP).

Usage::

    python benchmarks/redis_frozen_latency.py [--duration 10] [--threads 4] [--pace-ms 20]
        [--timeout-s 2] [--retry-s 1] [--json out.json]

Starts its own ``redis-server`` (127.0.0.1, a free port, nothing persisted) and a
``StorageManager`` over L1 plus the Redis tier, as ``lmcache server --l2-adapter
'{"type": "resp", ...}'`` builds it, with the tier's default socket timeout (2 s) and
probe interval (1 s).  Each phase runs ``--threads`` lookup threads and one store thread
for ``--duration`` seconds, each call paced ``--pace-ms`` apart:

* lookup: ``batched_contains`` of 8 chunks that are in Redis only (a prefix lookup that
  reaches Redis, as the server's ``lookup``);
* store: what the server's ``store`` does with the storage: ``contains`` of the new chunk
  (its "is it missing" check, which reaches Redis) and ``batched_submit_put_task`` (L1
  plus the write-through to Redis).

Printed per phase and operation: calls, p50, p99, p99.9 and max in milliseconds, and the
calls that waited at least half the socket timeout (``slow``).  Only public API of the
storage layer is used, so the script also runs against older checkouts (``PYTHONPATH``)
for a before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable

import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.redis_backend import RedisBackend, RedisSettings
from lmcache.v1.storage_backend.storage_manager import StorageManager

SHAPE = torch.Size([2, 2, 16, 32])  # 4 KiB of half per chunk
LOOKUP_CHUNKS = 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], int]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not on PATH (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def key(i: int) -> CacheEngineKey:
    return CacheEngineKey("bench/model", 1, 0, i, torch.half)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_phase(
    calls: dict[str, tuple[Callable[[int], None], int]],
    duration_s: float,
    pace_s: float,
    phase: int,
) -> dict[str, list[float]]:
    """Each named call on its own threads (count given), paced, for ``duration_s``; the
    call's argument is unique across threads and phases (stores write new chunks)."""
    latencies: dict[str, list[float]] = {name: [] for name in calls}
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s

    def loop(name: str, call: Callable[[int], None], seed: int) -> None:
        i = seed
        while time.monotonic() < stop_at:
            start = time.monotonic()
            call(i)
            elapsed = time.monotonic() - start
            with lock:
                latencies[name].append(elapsed)
            i += 1
            time.sleep(max(0.0, pace_s - elapsed))

    threads = [
        threading.Thread(
            target=loop, args=(name, call, 100_000_000 * phase + 10_000_000 * n + t * 100_000)
        )
        for n, (name, (call, count)) in enumerate(calls.items())
        for t in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def summarize(phase: str, latencies: dict[str, list[float]], timeout_s: float) -> list[dict]:
    rows = []
    for name, values in latencies.items():
        rows.append(
            {
                "phase": phase,
                "op": name,
                "calls": len(values),
                "p50_ms": 1000 * percentile(values, 0.50),
                "p99_ms": 1000 * percentile(values, 0.99),
                "p999_ms": 1000 * percentile(values, 0.999),
                "max_ms": 1000 * max(values),
                "slow": sum(v >= timeout_s / 2 for v in values),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument("--timeout-s", type=float, default=2.0)
    parser.add_argument("--retry-s", type=float, default=1.0)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="lmc-bench-redis-")
    proc, port = start_redis(workdir)
    config = LMCacheEngineConfig.from_defaults(max_local_cpu_size="64MiB")
    cpu = LocalCPUBackend(config)
    settings = RedisSettings(
        url=f"redis://127.0.0.1:{port}",
        namespace=f"bench-{uuid.uuid4().hex[:8]}",
        timeout_s=args.timeout_s,
        retry_interval_s=args.retry_s,
    )
    tier = RedisBackend(dst_device="cpu", local_cpu_backend=cpu, settings=settings)
    backends: OrderedDict[str, StorageBackendInterface] = OrderedDict()
    backends["LocalCPUBackend"] = cpu
    backends["RedisBackend"] = tier
    manager = StorageManager(config, backends=backends)
    rows: list[dict] = []
    try:
        in_redis = [key(i) for i in range(LOOKUP_CHUNKS)]
        for k in in_redis:  # in Redis only, so lookups reach Redis
            obj = cpu.allocate(SHAPE, torch.half)
            assert obj is not None
            for future in tier.batched_submit_put_task([k], [obj]) or []:
                future.result()
            obj.ref_count_down()
        tier.wait_for_puts()
        assert tier.batched_contains(in_redis) == LOOKUP_CHUNKS

        def lookup(_: int) -> None:
            manager.batched_contains(in_redis)

        def store(i: int) -> None:
            k = key(i)
            if not manager.contains(k):
                obj = manager.allocate(SHAPE, torch.half)
                if obj is not None:
                    manager.batched_submit_put_task([k], [obj])
                    obj.ref_count_down()

        calls: dict[str, tuple[Callable[[int], None], int]] = {
            "lookup": (lookup, args.threads),
            "store": (store, 1),
        }
        pace = args.pace_ms / 1000
        rows += summarize("healthy", run_phase(calls, args.duration, pace, 1), args.timeout_s)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            frozen = run_phase(calls, args.duration, pace, 2)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        rows += summarize("frozen", frozen, args.timeout_s)
        stats = tier.get_stats()
    finally:
        manager.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"Redis tier, socket timeout {args.timeout_s} s, probe interval {args.retry_s} s, "
        f"{args.threads} lookup threads + 1 store thread, {args.pace_ms} ms pace, "
        f"{args.duration} s per phase"
    )
    print("| Redis | op | calls | p50 ms | p99 ms | p99.9 ms | max ms | slow (>= timeout/2) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['phase']} | {r['op']} | {r['calls']} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['p999_ms']:.2f} | {r['max_ms']:.1f} | {r['slow']} |"
        )
    print(f"tier stats: {stats}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "stats": stats}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
