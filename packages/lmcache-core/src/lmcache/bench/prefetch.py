"""Lookup latency and time to retrieve of a request held only below L1, prefetch off vs on.

A request of ``--chunks`` chunks is stored, then dropped from L1 so it lives only on the
disk tier (and, when ``redis-server`` is on PATH or ``--redis-url`` is given, only in
Redis); for the disk tier the files are also dropped from the page cache
(``posix_fadvise(DONTNEED)``, ``--warm-disk`` keeps them) so reads really go to the
device.  One run measures, on the same data, the cache server in-process (its real
``lookup`` / ``query_prefetch_status`` / retrieve path, no transport) twice:

* **sync** -- ``--l2-prefetch-max-in-flight 0``: the lookup only counts, the retrieve
  reads the lower tier itself;
* **prefetch** -- ``--l2-prefetch-max-in-flight N``: the lookup starts promoting the hits
  into L1 and replies; the retrieve waits only for chunks still on their way.

Per scenario (``--gaps-ms``: the engine's scheduling time between the lookup reply and
the retrieve; 0 = retrieve at once), medians of ``--repeats``: the lookup call, the
retrieve (the server's chunk fetch plus a copy of every chunk into a destination
buffer, standing in for the KV pages) and lookup-start-to-data.  ``--json`` is the
``lmcache bench`` document (:mod:`lmcache.bench._output`); ``--plot`` charts the times.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lmcache.bench._output import add_output_arguments, progress, require_matplotlib, write_json
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.state import CacheServerSettings
from lmcache.v1.multiprocess.wire.chunking import prefix_chunks
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey
from lmcache.v1.storage_backend.storage_manager import StorageManager

MODES = {"sync": 0, "prefetch": None}  # None: --max-in-flight


@dataclasses.dataclass
class Row:
    tier: str
    gap_ms: float
    mode: str
    lookup_ms: float
    retrieve_ms: float
    lookup_to_data_ms: float
    chunks: int
    chunk_mib: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chunks", type=int, default=16, help="chunks in the request")
    parser.add_argument("--chunk-mib", type=float, default=2.0, help="MiB per chunk")
    parser.add_argument("--max-in-flight", type=int, default=8, help="prefetch concurrency")
    parser.add_argument(
        "--gaps-ms",
        default="0,20",
        help="comma-separated engine scheduling gaps between lookup and retrieve",
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed runs per gap (median reported)"
    )
    parser.add_argument("--dir", default=None, help="scratch directory for the disk tier")
    parser.add_argument(
        "--warm-disk", action="store_true", help="leave the chunk files in the page cache"
    )
    parser.add_argument(
        "--redis-url", default=None, help="redis:// URL; default: a private redis-server"
    )
    parser.add_argument("--no-redis", action="store_true", help="measure the disk tier only")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for smoke tests")
    add_output_arguments(parser)


# -- one tier, one mode -------------------------------------------------------------------


class _Setup:
    """A server over L1 + one lower tier holding the request, and the request's keys."""

    def __init__(self, config: LMCacheEngineConfig, max_in_flight: int, args: Any) -> None:
        self.storage = StorageManager(config)
        self.chunk_tokens = 16
        settings = CacheServerSettings(
            chunk_size=self.chunk_tokens, prefetch_max_in_flight=max_in_flight
        )
        self.server = MPCacheServer(settings, self.storage, enable_metrics=False)
        self.numel = int(args.chunk_mib * 1024**2)
        tokens = tuple(range(args.chunks * self.chunk_tokens))
        self.key = IPCCacheServerKey("bench/model", 1, None, tokens, 0, len(tokens))
        spans = prefix_chunks(self.key, self.chunk_tokens)
        self.keys = [self.server._storage_key(self.key, 0, s.chunk_hash) for s in spans]
        self.dest = torch.empty(self.numel, dtype=torch.uint8)
        self._store()

    def _store(self) -> None:
        for i, key in enumerate(self.keys):
            obj = self.storage.allocate(torch.Size([self.numel]), torch.uint8)
            if obj is None or obj.tensor is None:
                raise SystemExit("L1 too small for one chunk")
            obj.tensor.fill_(i % 251)
            self.storage.batched_submit_put_task([key], [obj])
            obj.ref_count_down()
        self.storage.wait_for_puts()

    def drop_from_l1(self) -> None:
        for key in self.keys:
            self.storage.local_cpu_backend.remove(key)

    def close(self) -> None:
        self.server.close()


def _one_request(setup: _Setup, rid: str, gap_s: float) -> tuple[float, float, float]:
    server = setup.server
    key = dataclasses.replace(setup.key, request_id=rid)
    t0 = time.perf_counter()
    server.lookup(key, 1)
    t1 = time.perf_counter()
    if gap_s:
        time.sleep(gap_s)
    t2 = time.perf_counter()
    objs = server._get_all(setup.keys)  # the retrieve's fetch, as both transfer modes do
    if objs is None:
        raise SystemExit("retrieve missed: the benchmark's chunks were lost")
    for i, obj in enumerate(objs):  # the copy into the KV pages
        assert obj.tensor is not None
        setup.dest.copy_(obj.tensor.view(torch.uint8)[: setup.numel])
        if int(setup.dest[0]) != i % 251:
            raise SystemExit("retrieve returned wrong bytes")
        obj.ref_count_down()
    t3 = time.perf_counter()
    server.end_session(rid)
    return (t1 - t0) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3


def _measure(
    make_config: Callable[[], LMCacheEngineConfig],
    make_cold: Callable[[_Setup], None],
    tier: str,
    args: Any,
    gaps: list[float],
    bar: Any,
) -> list[Row]:
    rows = []
    for mode, fixed in MODES.items():
        in_flight = args.max_in_flight if fixed is None else fixed
        setup = _Setup(make_config(), in_flight, args)
        try:
            for gap in gaps:
                samples = []
                for r in range(args.repeats + 1):  # the first is a warm-up
                    setup.drop_from_l1()
                    make_cold(setup)
                    sample = _one_request(setup, f"{tier}-{mode}-{gap}-{r}", gap / 1e3)
                    if r:
                        samples.append(sample)
                    bar.update()
                lookup, retrieve, total = (statistics.median(s) for s in zip(*samples))
                rows.append(
                    Row(tier, gap, mode, lookup, retrieve, total, args.chunks, args.chunk_mib)
                )
        finally:
            setup.close()
    return rows


# -- tiers --------------------------------------------------------------------------------


def _drop_page_cache(folder: str) -> None:
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def _l1_size(args: Any) -> str:
    return f"{int((args.chunks + 4) * args.chunk_mib * 2 * 1024**2)}B"


def _bench_disk(args: Any, gaps: list[float], bar: Any) -> list[Row]:
    scratch = tempfile.mkdtemp(prefix="lmc-bench-prefetch-", dir=args.dir)
    count = [0]

    def config() -> LMCacheEngineConfig:
        count[0] += 1  # a fresh folder per server: no adoption of the other's files
        return LMCacheEngineConfig.from_defaults(
            max_local_cpu_size=_l1_size(args),
            local_disk=os.path.join(scratch, str(count[0])),
            max_local_disk_size=f"{int(args.chunks * args.chunk_mib * 2 * 1024**2)}B",
            blocking_timeout_secs=5,
        )

    def cold(setup: _Setup) -> None:
        if not args.warm_disk:
            _drop_page_cache(scratch)

    try:
        return _measure(config, cold, "disk", args, gaps, bar)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _redis_url(args: Any) -> Iterator[str | None]:
    if args.redis_url:
        yield args.redis_url
    elif args.no_redis or shutil.which("redis-server") is None:
        yield None
    else:
        from lmcache.bench.storage import _private_redis

        with _private_redis() as url:
            yield url


def _bench_redis(url: str, args: Any, gaps: list[float], bar: Any) -> list[Row]:
    def config() -> LMCacheEngineConfig:
        return LMCacheEngineConfig.from_defaults(
            max_local_cpu_size=_l1_size(args), remote_url=url, blocking_timeout_secs=5
        )

    return _measure(config, lambda _setup: None, "redis", args, gaps, bar)


# -- output -------------------------------------------------------------------------------


def _pairs(rows: list[Row]) -> list[tuple[Row, Row]]:
    by = {(r.tier, r.gap_ms, r.mode): r for r in rows}
    return [(r, by[(r.tier, r.gap_ms, "prefetch")]) for r in rows if r.mode == "sync"]


def _print(rows: list[Row], args: Any) -> None:
    print(
        f"request: {args.chunks} chunks x {args.chunk_mib:g} MiB, only below L1; "
        f"prefetch concurrency {args.max_in_flight}; medians of {args.repeats}; "
        f"ratio = sync / prefetch (> 1: prefetch faster)"
    )
    columns = ("lookup ms", "retrieve ms", "lookup->data ms")
    header = f"{'tier':<6} {'gap ms':>6} | " + " | ".join(f"{c:>19} {'ratio':>6}" for c in columns)
    print(f"{'':<6} {'':>6} | {'sync / prefetch':>19} {'':>6} | {'sync / prefetch':>19} "
          f"{'':>6} | {'sync / prefetch':>19}")  # fmt: skip
    print(header)
    print("-" * len(header))
    for s, p in _pairs(rows):
        cells = []
        for a, b in (
            (s.lookup_ms, p.lookup_ms),
            (s.retrieve_ms, p.retrieve_ms),
            (s.lookup_to_data_ms, p.lookup_to_data_ms),
        ):
            cells.append(f"{a:>9.2f} / {b:>7.2f} {a / b:>6.2f}")
        print(f"{s.tier:<6} {s.gap_ms:>6g} | " + " | ".join(cells))


def _plot(rows: list[Row], path: str) -> None:
    plt = require_matplotlib()
    pairs = _pairs(rows)
    labels = [f"{s.tier} gap {s.gap_ms:g}ms" for s, _ in pairs]
    fig, axes = plt.subplots(1, 3, figsize=(max(9.0, 2.2 * len(labels) + 4), 4))
    for ax, field in zip(axes, ("lookup_ms", "retrieve_ms", "lookup_to_data_ms")):
        xs = list(range(len(labels)))
        ax.bar([x - 0.2 for x in xs], [getattr(s, field) for s, _ in pairs], 0.4, label="sync")
        ax.bar([x + 0.2 for x in xs], [getattr(p, field) for _, p in pairs], 0.4, label="prefetch")
        ax.set_xticks(xs, labels, fontsize=7, rotation=20)
        ax.set_title(field.replace("_", " "))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(f"chart written to {path}")


def run(args: argparse.Namespace) -> int:
    if args.plot:
        require_matplotlib()  # fail before measuring, not after
    if args.quick:
        args.chunks, args.chunk_mib, args.repeats = 4, 0.0625, 1
    if args.chunks < 1 or args.chunk_mib <= 0 or args.repeats < 1 or args.max_in_flight < 1:
        raise SystemExit("--chunks, --chunk-mib, --repeats and --max-in-flight must be > 0")
    try:
        gaps = [float(g) for g in str(args.gaps_ms).split(",") if g.strip()]
    except ValueError:
        raise SystemExit(f"--gaps-ms: {args.gaps_ms!r} is not a list of numbers") from None
    rows: list[Row] = []
    with _redis_url(args) as url:
        tiers = 1 + (url is not None)
        bar = progress(tiers * len(MODES) * len(gaps) * (args.repeats + 1), "bench prefetch")
        try:
            rows += _bench_disk(args, gaps, bar)
            if url is not None:
                rows += _bench_redis(url, args, gaps, bar)
        finally:
            bar.close()
    _print(rows, args)
    if args.json:
        write_json(args.json, "prefetch", args, [dataclasses.asdict(r) for r in rows])
    if args.plot:
        _plot(rows, args.plot)
    return 0
