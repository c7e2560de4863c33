"""Block KV transfer per layout family: selected backend vs torch baseline vs memcpy bound.

For each family (NHD layer list, HND, MLA, fused K|V, cross-layer) this stores chunks from a
paged cache into LMCache objects (D2H) and loads them back (H2D) with
``multi_layer_block_kv_transfer``, side by side in one process: the selected backend's op
(``lmcache.device_ops``, or the baseline with ``--backend torch``), the torch baseline, and
contiguous copies of the same bytes (the memcpy bound). Op times are medians of repeats
after warm-up (``time.perf_counter``); the bound is the best of several samples, each of
at least ``BOUND_SAMPLE_SECONDS`` of copies, with torch's thread pool and with one thread.
``--json`` / ``--plot`` / the progress bar: :mod:`lmcache.bench._output`.

:func:`compare_block_transfer` is the same measurement for any set of ops on any device
(``lmcache plugin check --bench`` uses it).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch

from lmcache.bench._output import (
    Bar,
    add_output_arguments,
    plot_bars,
    progress,
    require_matplotlib,
    write_json,
)
from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc, TransferDirection

FAMILIES: tuple[tuple[str, EngineKVFormat], ...] = (
    ("nhd_layer_list", EngineKVFormat.NL_X_TWO_NB_BS_NH_HS),
    ("hnd_layer_list", EngineKVFormat.NL_X_TWO_NB_NH_BS_HS),
    ("mla", EngineKVFormat.NL_X_NB_BS_HS),
    ("fused_kv_vllm_cpu", EngineKVFormat.NL_X_NB_NH_BS_CS),
    ("cross_layer", EngineKVFormat.NB_NL_TWO_BS_NH_HS),
)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# Each sample of the memcpy bound copies for at least this long (and at most
# BOUND_MAX_COPIES times): one copy of a few MiB is over before the timer's and the thread
# pool's fixed costs are.
BOUND_SAMPLE_SECONDS = 0.005
BOUND_MAX_COPIES = 10_000
BOUND_MIN_SAMPLES = 5


@dataclass
class Row:
    family: str
    engine_kv_format: str
    direction: str
    bytes: int
    candidate_gbps: float
    baseline_gbps: float
    memcpy_gbps: float

    @property
    def vs_baseline(self) -> float:
        return self.candidate_gbps / self.baseline_gbps

    @property
    def vs_memcpy(self) -> float:
        return self.candidate_gbps / self.memcpy_gbps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        default="selected",
        choices=["selected", "torch"],
        help="candidate: lmcache.device_ops (selected) or the torch baseline",
    )
    parser.add_argument("--layers", type=int, default=32, help="KV layers")
    parser.add_argument("--kv-heads", type=int, default=8, help="KV heads per layer")
    parser.add_argument("--head-dim", type=int, default=128, help="elements per head")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per paged block")
    parser.add_argument("--chunk-tokens", type=int, default=256, help="tokens per LMCache object")
    parser.add_argument("--chunks", type=int, default=4, help="LMCache objects per call")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16", help="KV element type")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls (median reported)")
    parser.add_argument(
        "--family",
        action="append",
        choices=[f for f, _ in FAMILIES],
        help="only these families (repeatable)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny shapes, for smoke tests")
    add_output_arguments(parser)


def _apply_quick(args: argparse.Namespace) -> None:
    if args.quick:
        args.layers, args.kv_heads, args.head_dim = 2, 2, 16
        args.block_size, args.chunk_tokens, args.chunks = 4, 16, 2
        args.warmup, args.repeats = 1, 3


def _candidate(backend: str) -> tuple[str, Callable[..., None]]:
    if backend == "torch":
        return "torch_ops", torch_ops.multi_layer_block_kv_transfer
    try:
        from lmcache import device_ops

        op = device_ops.multi_layer_block_kv_transfer
        return type(device_ops).__name__, op
    except Exception as exc:  # registry not available: say so and measure the baseline
        print(f"(no lmcache.device_ops: {exc}; candidate = torch baseline)")
        return "torch_ops", torch_ops.multi_layer_block_kv_transfer


@dataclass
class Workload:
    paged: Any
    objects: list[torch.Tensor]
    block_ids: torch.Tensor
    desc: PageBufferShapeDesc
    chunk_tokens: int
    fmt: EngineKVFormat
    nbytes: int


def _engine_shape(
    fmt: EngineKVFormat, nb: int, bs: int, nh: int, hs: int, nl: int
) -> tuple[int, ...]:
    shapes = {
        EngineKVFormat.NL_X_TWO_NB_BS_NH_HS: (2, nb, bs, nh, hs),
        EngineKVFormat.NL_X_TWO_NB_NH_BS_HS: (2, nb, nh, bs, hs),
        EngineKVFormat.NL_X_NB_BS_HS: (nb, bs, hs),
        EngineKVFormat.NL_X_NB_NH_BS_CS: (nb, nh, bs, 2 * hs),
        EngineKVFormat.NB_NL_TWO_BS_NH_HS: (nb, nl, 2, bs, nh, hs),
    }
    return shapes[fmt]


def _workload(fmt: EngineKVFormat, args: argparse.Namespace, device: str = "cpu") -> Workload:
    dtype = DTYPES[args.dtype]
    nl, nh, hs, bs = args.layers, args.kv_heads, args.head_dim, args.block_size
    spec = torch_ops._format_spec(fmt)
    blocks_needed = args.chunks * args.chunk_tokens // bs
    nb = 2 * blocks_needed
    shape = _engine_shape(fmt, nb, bs, nh, hs, nl)
    if spec.cross_layer:
        paged: Any = torch.randn(shape).to(device=device, dtype=dtype)
    else:
        paged = [torch.randn(shape).to(device=device, dtype=dtype) for _ in range(nl)]
    heads, width = (1, hs) if spec.mla else (nh, 2 * hs if spec.fused_packed else hs)
    kv = spec.kv_size
    obj_shape = (nl, args.chunk_tokens, heads * width)
    objects = [torch.zeros(((kv,) if kv == 2 else ()) + obj_shape, dtype=dtype)
               for _ in range(args.chunks)]  # fmt: skip
    desc = PageBufferShapeDesc(kv_size=kv, nl=nl, nb=nb, bs=bs, nh=heads, hs=width,
                               element_size=torch.empty(0, dtype=dtype).element_size(),
                               dtype=dtype)  # fmt: skip
    block_ids = torch.randperm(nb, generator=torch.Generator().manual_seed(0))[:blocks_needed]
    nbytes = sum(o.numel() * o.element_size() for o in objects)
    return Workload(paged, objects, block_ids, desc, args.chunk_tokens, fmt, nbytes)


def _median_seconds(fn: Callable[[], Any], warmup: int, repeats: int, bar: Bar) -> float:
    for _ in range(warmup):
        fn()
        bar.update(1)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
        bar.update(1)
    return statistics.median(samples)


# candidate and baseline per direction: timed passes per family (the bound is extra)
_MEASUREMENTS_PER_FAMILY = 2 * 2


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` for the block, then restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _copy_rate(copy: Callable[[], Any], nbytes: int, clock: Callable[[], float]) -> float:
    """GB/s of one sample: copies until ``BOUND_SAMPLE_SECONDS`` have passed."""
    copies, start = 0, clock()
    elapsed = 0.0
    while copies < BOUND_MAX_COPIES and (copies == 0 or elapsed < BOUND_SAMPLE_SECONDS):
        copy()
        copies += 1
        elapsed = clock() - start
    return _gbps(nbytes * copies, max(elapsed, 1e-9))


def memcpy_bound_gbps(
    nbytes: int,
    samples: int,
    copy: Callable[[], Any] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The fastest contiguous copy of ``nbytes`` on this host, in GB/s.

    A bound is a best case, so the best sample counts, and torch's thread pool is tried
    with one thread too: on a loaded host one parallel copy of a few MiB waits for a
    descheduled pool thread (10-20x slower), while the ops it bounds copy rows too small
    to be split across threads.
    """
    if copy is None:
        src = torch.empty(nbytes, dtype=torch.uint8).random_(0, 255)
        dst = torch.empty_like(src)

        def copy() -> Any:
            return dst.copy_(src)

    best = 0.0
    for threads in sorted({torch.get_num_threads(), 1}, reverse=True):
        with torch_threads(threads):
            _copy_rate(copy, nbytes, clock)  # first touch of dst, thread pool start-up
            for _ in range(max(samples, BOUND_MIN_SAMPLES)):
                best = max(best, _copy_rate(copy, nbytes, clock))
    return best


def _measure(
    family: str, w: Workload, op: Callable[..., None], args: argparse.Namespace, bar: Bar
) -> list[Row]:
    bar.set_description_str(f"bench ops {family}")
    memcpy = memcpy_bound_gbps(w.nbytes, args.repeats)
    rows = []
    for direction in (TransferDirection.D2H, TransferDirection.H2D):

        def call(fn: Callable[..., None], direction: TransferDirection = direction) -> None:
            fn(w.paged, w.objects, w.block_ids, "cpu", direction, w.desc, w.chunk_tokens, w.fmt, 0)

        times = {
            name: _median_seconds(lambda f=fn: call(f), args.warmup, args.repeats, bar)  # type: ignore[misc]
            for name, fn in (
                ("candidate", op),
                ("baseline", torch_ops.multi_layer_block_kv_transfer),
            )
        }
        rows.append(Row(family, w.fmt.name, direction.name, w.nbytes,
                        _gbps(w.nbytes, times["candidate"]), _gbps(w.nbytes, times["baseline"]),
                        memcpy))  # fmt: skip
    return rows


def bench_arguments(*argv: str) -> argparse.Namespace:
    """This benchmark's arguments (defaults, overridden by ``argv``), for callers that
    measure without the command line."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    _apply_quick(args)
    return args


def _interleaved_best(
    calls: Mapping[str, Callable[[], Any]], warmup: int, repeats: int
) -> dict[str, float]:
    """Fewest seconds of each call, timed in turns (A B A B ...) so a change of load on
    the host hits every call alike.  The best, not the median: on a loaded host most
    calls of a multi-threaded torch op wait for a descheduled pool thread (medians of one
    op differ 10x from run to run, best times by well under 2x)."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    samples: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(repeats):
        for label, call in calls.items():
            start = time.perf_counter()
            call()
            samples[label].append(time.perf_counter() - start)
    return {label: min(times) for label, times in samples.items()}


def compare_block_transfer(
    ops: Mapping[str, Callable[..., None]],
    args: argparse.Namespace,
    family: str = "nhd_layer_list",
    device: str = "cpu",
) -> dict[str, dict[str, float]]:
    """GB/s of each ``multi_layer_block_kv_transfer`` in ``ops`` (label -> function) on one
    workload of ``family``, the paged cache on ``device``: direction -> label -> GB/s.
    The ops take turns, call by call; each one's best call counts (:func:`_interleaved_best`)."""
    fmt = dict(FAMILIES)[family]
    w = _workload(fmt, args, device)
    module = getattr(torch, torch.device(device).type, None)
    sync: Callable[[], Any] = getattr(module, "synchronize", None) or (lambda: None)
    rates: dict[str, dict[str, float]] = {}
    for direction in (TransferDirection.D2H, TransferDirection.H2D):

        def bind(fn: Callable[..., None], direction: TransferDirection = direction) -> Any:
            def call() -> None:
                fn(w.paged, w.objects, w.block_ids, device, direction, w.desc, w.chunk_tokens,
                   w.fmt, 0)  # fmt: skip
                sync()  # an accelerator's copies are asynchronous: time them to the end

            return call

        calls = {label: bind(fn) for label, fn in ops.items()}
        seconds = _interleaved_best(calls, args.warmup, args.repeats)
        rates[direction.name] = {label: _gbps(w.nbytes, s) for label, s in seconds.items()}
    return rates


def _print_table(candidate: str, rows: list[Row]) -> None:
    header = (f"{'family':<18} {'dir':<4} {'MiB':>7} {'candidate':>10} {'baseline':>10} "
              f"{'memcpy':>8} {'cand/base':>10} {'cand/memcpy':>12}")  # fmt: skip
    print(f"candidate = {candidate}; GB/s (1e9 bytes/s), median of repeats")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.family:<18} {r.direction:<4} {r.bytes / 2**20:>7.1f} {r.candidate_gbps:>10.2f} "
              f"{r.baseline_gbps:>10.2f} {r.memcpy_gbps:>8.2f} {r.vs_baseline:>10.2f} "
              f"{r.vs_memcpy:>12.2f}")  # fmt: skip


def _plot(candidate: str, rows: list[Row], path: str) -> None:
    plot_bars(
        path,
        f"Block KV transfer per layout family (candidate = {candidate})",
        [f"{r.family} {r.direction}" for r in rows],
        {
            "candidate": [r.candidate_gbps for r in rows],
            "baseline": [r.baseline_gbps for r in rows],
            "memcpy": [r.memcpy_gbps for r in rows],
        },
        {
            "candidate / baseline": [r.vs_baseline for r in rows],
            "candidate / memcpy": [r.vs_memcpy for r in rows],
        },
        "ratio",
    )


def run(args: argparse.Namespace) -> int:
    if args.plot:
        require_matplotlib()  # fail before measuring, not after
    _apply_quick(args)
    candidate, op = _candidate(args.backend)
    torch.manual_seed(0)
    families = [(f, fmt) for f, fmt in FAMILIES if not args.family or f in args.family]
    passes = _MEASUREMENTS_PER_FAMILY * (args.warmup + args.repeats)
    bar = progress(len(families) * passes, "bench ops")
    rows: list[Row] = []
    try:
        for family, fmt in families:
            rows.extend(_measure(family, _workload(fmt, args), op, args, bar))
    finally:
        bar.close()
    _print_table(candidate, rows)
    if args.json:
        results = [asdict(r) | {"vs_baseline": r.vs_baseline, "vs_memcpy": r.vs_memcpy}
                   for r in rows]  # fmt: skip
        summary = {"candidate": candidate, "threads": torch.get_num_threads()}
        write_json(args.json, "ops", args, results, summary=summary)
    if args.plot:
        _plot(candidate, rows, args.plot)
    return 0
