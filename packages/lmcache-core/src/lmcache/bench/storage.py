"""Storage tier put/get throughput vs the raw store, and prefix-lookup round trips.

For each backend in :data:`BACKENDS` (``--backend``; default ``local``: the CPU and disk
tiers and the prefix lookup, no server needed; ``redis`` only when asked), one run
measures side by side:
``batched_submit_put_task`` + wait and ``batched_get_blocking`` of whole 256-token chunks
through the tier, the raw store doing the same bytes without the tier (for Redis:
pipelined ``SET`` / ``MGET`` of equally sized values on the same redis-py + hiredis
client), and the network round trips one prefix lookup of a request costs.  Times are
medians of repeats after warm-up; GB/s are 1e9 bytes/s of chunk payload.  ``--json`` /
``--plot`` / the progress bar: :mod:`lmcache.bench._output`.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import torch

from lmcache.bench import _storage_local, _storage_serde
from lmcache.bench._output import (
    Bar,
    add_output_arguments,
    plot_bars,
    progress,
    require_matplotlib,
    write_json,
)
from lmcache.bench._storage_rows import DTYPES, Row
from lmcache.bench._storage_rows import chunk_shape as _chunk_shape
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="local",
        help="local (default) = cpu + disk + prefix lookup side by side; "
        "redis needs a redis-server on PATH or --url",
    )
    parser.add_argument(
        "--url",
        help="redis:// URL of a running server; default: start a private redis-server",
    )
    parser.add_argument("--cluster", action="store_true", help="--url is a Redis Cluster node")
    parser.add_argument("--layers", type=int, default=32, help="KV layers per chunk")
    parser.add_argument("--kv-heads", type=int, default=8, help="KV heads per layer")
    parser.add_argument("--head-dim", type=int, default=128, help="elements per head")
    parser.add_argument("--chunk-tokens", type=int, default=256, help="tokens per chunk")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="KV element type")
    parser.add_argument("--chunks", type=int, default=8, help="chunks per put/get call")
    parser.add_argument("--lookup-keys", type=int, default=64, help="keys per prefix lookup")
    parser.add_argument(
        "--num-keys", type=int, default=1_000_000, help="stored keys for the cpu/disk lookup"
    )
    parser.add_argument("--dir", default=None, help="scratch directory for the disk tier")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs (median reported)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, for smoke tests")
    parser.add_argument(
        "--serde",
        type=_storage_serde.serde_arg,
        action="append",
        metavar="SPEC",
        help="measure L2 serdes instead of the tiers (repeatable): fp8, fp8-e5m2, "
        "asym_k16_v8, aesgcm, multi (asym_k16_v8 then aesgcm), all, or a serde JSON object",
    )
    add_output_arguments(parser)


def _apply_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.layers, args.kv_heads, args.head_dim, args.chunks = 2, 2, 16, 2
        args.warmup, args.repeats, args.lookup_keys = 1, 3, 8


def _keys(n: int, dtype: torch.dtype) -> list[CacheEngineKey]:
    base = uuid.uuid4().int >> 64
    return [CacheEngineKey("bench/model", 1, 0, base + i, dtype) for i in range(n)]


# -- redis ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _private_redis() -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not on PATH: install it or pass --url")
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="lmc-bench-redis-") as tmp:
        proc = subprocess.Popen(
            [
                exe,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                tmp,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for_port(port)
            yield f"redis://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _wait_for_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"redis-server on port {port} did not start")


def _bench_redis(args: argparse.Namespace, bar: Bar) -> tuple[list[Any], dict[str, Any]]:
    from lmcache.v1.storage_backend.redis.backend import RedisBackend
    from lmcache.v1.storage_backend.redis.settings import RedisSettings

    with _private_redis() if args.url is None else _given(args.url) as url:
        dtype = DTYPES[args.dtype]
        shape = _chunk_shape(args)
        chunk_bytes = shape.numel() * dtype.itemsize
        cpu = LocalCPUBackend(
            LMCacheEngineConfig.from_defaults(
                local_cpu=False, max_local_cpu_size=f"{3 * args.chunks * chunk_bytes + 2**24}B"
            )
        )
        settings = RedisSettings(
            url=url, cluster=args.cluster, namespace=f"bench-{uuid.uuid4().hex[:8]}",
            timeout_s=30.0, max_batch_bytes=max(chunk_bytes * args.chunks, 1),
        )  # fmt: skip
        tier = RedisBackend(dst_device="cpu", local_cpu_backend=cpu, settings=settings)
        raw = tier._get_client()  # same pool, connection class and hiredis parser
        try:
            objs = cpu.batched_allocate(shape, dtype, args.chunks, busy_loop=False)
            assert objs is not None, "bench allocator too small"
            for obj in objs:
                assert obj.tensor is not None
                obj.tensor.copy_(torch.randn(shape).to(dtype))
            raw_values = [bytes(obj.byte_array) for obj in objs]
            rows = _redis_rows(args, tier, raw, objs, raw_values, dtype, chunk_bytes, bar)
            lookup = _redis_lookup(args, tier, objs, dtype)
            bar.update(1)
            for obj in objs:
                obj.ref_count_down()
        finally:
            tier.close()
            cpu.close()
    return rows, lookup


@contextmanager
def _given(url: str) -> Iterator[str]:
    yield url


def _redis_rows(
    args: argparse.Namespace,
    tier: Any,
    raw: Any,
    objs: list[MemoryObj],
    raw_values: list[bytes],
    dtype: torch.dtype,
    chunk_bytes: int,
    bar: Bar,
) -> list[Row]:
    """Tier and raw runs alternate (drift on a shared machine hits both alike); every put
    writes fresh keys, deleted again outside the timed region, so Redis does equal work."""
    n = args.chunks
    raw_prefix = f"{tier.settings.namespace}:raw:"
    times: dict[str, list[float]] = {"tier_put": [], "raw_put": [], "tier_get": [], "raw_get": []}
    for repeat in range(args.warmup + args.repeats):
        keys = _keys(n, dtype)
        names = [f"{raw_prefix}{uuid.uuid4().hex}" for _ in range(n)]

        def tier_put(keys: list[CacheEngineKey] = keys) -> None:
            for future in tier.batched_submit_put_task(keys, objs) or []:
                future.result()

        def raw_put(names: list[str] = names) -> None:
            pipe = raw.pipeline(transaction=False)
            for name, value in zip(names, raw_values):
                pipe.set(name, value)
            pipe.execute()

        def tier_get(keys: list[CacheEngineKey] = keys) -> None:
            got = tier.batched_get_blocking(keys)
            assert all(obj is not None for obj in got), "tier get missed"
            for obj in got:
                obj.ref_count_down()

        def raw_get(names: list[str] = names) -> None:
            assert all(v is not None for v in raw.mget(names)), "raw get missed"

        for name, fn in (("tier_put", tier_put), ("raw_put", raw_put),
                         ("tier_get", tier_get), ("raw_get", raw_get)):  # fmt: skip
            start = time.perf_counter()
            fn()
            if repeat >= args.warmup:
                times[name].append(time.perf_counter() - start)
        tier.batched_remove(keys)
        raw.delete(*names)
        bar.update(1)
    total = n * chunk_bytes
    gbps = {name: total / statistics.median(samples) / 1e9 for name, samples in times.items()}
    mib = chunk_bytes / 2**20
    return [
        Row("redis", "put", mib, n, gbps["tier_put"], gbps["raw_put"]),
        Row("redis", "get", mib, n, gbps["tier_get"], gbps["raw_get"]),
    ]


def _redis_lookup(
    args: argparse.Namespace, tier: Any, objs: list[MemoryObj], dtype: torch.dtype
) -> dict[str, Any]:
    """Round trips of one prefix lookup of ``lookup_keys`` keys (3/4 of them stored)."""
    keys = _keys(args.lookup_keys, dtype)
    stored = keys[: max(1, 3 * len(keys) // 4)]
    for future in tier.batched_submit_put_task(stored, [objs[0]] * len(stored)) or []:
        future.result()
    before = tier.get_stats()["round_trips"]
    hits = tier.batched_contains(keys)
    trips = tier.get_stats()["round_trips"] - before
    tier.batched_remove(stored)
    return {"keys": len(keys), "hits": hits, "round_trips": trips}


BACKENDS: dict[str, _storage_local.Benchmark] = {
    # one step per put/get round, plus the lookup
    "redis": _storage_local.Benchmark(_bench_redis, lambda a: _storage_local.passes(a) + 1),
    # cpu, disk and local (= cpu + disk + 1M-key lookup): lmcache.bench._storage_local
    **_storage_local.BENCHMARKS,
}
"""Backend name -> benchmark; each returns throughput rows and its prefix-lookup cost."""


def _print(rows: list[Row], lookup: dict[str, Any]) -> None:
    header = (f"{'backend':<8} {'op':<4} {'chunk MiB':>9} {'chunks':>6} {'tier GB/s':>10} "
              f"{'raw GB/s':>9} {'tier/raw':>9}")  # fmt: skip
    print(
        "GB/s (1e9 bytes/s) of chunk payload, median of repeats; raw = the store without the tier"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.backend:<8} {r.op:<4} {r.chunk_mib:>9.2f} {r.chunks:>6} {r.tier_gbps:>10.2f} "
              f"{r.raw_gbps:>9.2f} {r.ratio:>9.2f}")  # fmt: skip
    print(f"prefix lookup: {lookup['keys']} keys, {lookup['hits']} hits, "
          f"{lookup['round_trips']} round trip(s)")  # fmt: skip
    if "keys_per_s" in lookup:
        print(f"prefix lookup: {lookup['keys_per_s']:,.0f} keys/s vs dict loop "
              f"{lookup['dict_keys_per_s']:,.0f} keys/s "
              f"(ratio {lookup['keys_per_s'] / lookup['dict_keys_per_s']:.2f}); per CPU second "
              f"{lookup['keys_per_cpu_s']:,.0f} vs "
              f"{lookup['dict_keys_per_cpu_s']:,.0f}")  # fmt: skip


def _plot(rows: list[Row], path: str) -> None:
    plot_bars(
        path,
        "Storage tier put/get vs the raw store",
        [f"{r.backend} {r.op}" for r in rows],
        {"tier": [r.tier_gbps for r in rows], "raw": [r.raw_gbps for r in rows]},
        {"tier / raw": [r.ratio for r in rows]},
        "x raw",
    )


def _run_serde(args: argparse.Namespace) -> int:
    bar = progress(_storage_serde.steps(args), "bench storage serde")
    try:
        rows, info = _storage_serde.run(args, bar)
    finally:
        bar.close()
    _storage_serde.print_rows(rows)
    if args.json:
        results = [asdict(r) | {"encode_vs_copy": r.encode_vs_copy} for r in rows]
        write_json(args.json, "storage", args, results, serde=info)
    if args.plot:
        plot_bars(
            args.plot,
            "L2 serde encode/decode vs memcpy",
            [r.serde for r in rows],
            {"encode": [r.encode_gbps for r in rows], "decode": [r.decode_gbps for r in rows],
             "memcpy": [r.copy_gbps for r in rows]},
            {"stored %": [r.stored_pct for r in rows]},
            "% of chunk",
        )  # fmt: skip
    return 0


def run(args: argparse.Namespace) -> int:
    if args.plot:
        require_matplotlib()  # fail before measuring, not after
    _apply_quick(args)
    torch.manual_seed(0)
    if getattr(args, "serde", None):
        return _run_serde(args)
    benchmark = BACKENDS[args.backend]
    bar = progress(benchmark.steps(args), f"bench storage {args.backend}")
    try:
        rows, lookup = benchmark.run(args, bar)
    finally:
        bar.close()
    _print(rows, lookup)
    if args.json:
        results = [asdict(r) | {"ratio": r.ratio} for r in rows]
        write_json(args.json, "storage", args, results, lookup=lookup)
    if args.plot:
        _plot(rows, args.plot)
    return 0
