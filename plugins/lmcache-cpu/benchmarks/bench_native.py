"""Side-by-side throughput of the lmcache-cpu native ops, the torch baseline and memcpy.

For each dtype and direction it times, in one process and on the same buffers:

* ``native``   -- ``lmcache_cpu.native_ops.multi_layer_block_kv_transfer``
* ``baseline`` -- ``lmcache.v1.platform.torch_ops.multi_layer_block_kv_transfer``
* ``memcpy``   -- one contiguous ``torch`` copy of the same number of bytes (the bound)

gather = D2H (engine pages -> LMCache chunks), scatter = H2D (chunks -> engine pages).
Default shapes are a realistic 8B-class model: 32 layers, 8 KV heads, head dim 128, block
size 16, 256-token chunks, vLLM flash-attention layout ``NL x [2, NB, BS, NH, HS]``.

    python plugins/lmcache-cpu/benchmarks/bench_native.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc, TransferDirection
from lmcache_cpu import _native, native_ops

_SETTLE_SECONDS = 0.02
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--chunk-tokens", type=int, default=256)
    p.add_argument("--chunks", type=int, default=2, help="LMCache chunks moved per call")
    p.add_argument("--engine-blocks", type=int, default=128)
    p.add_argument("--dtypes", default="fp16,bf16")
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return p.parse_args()


def _interleaved_medians(
    fns: dict[str, Callable[[], None]], iters: int, warmup: int
) -> dict[str, float]:
    """Median seconds per function, timed round-robin so machine noise hits all alike.

    Each sample starts after a short pause: torch's OpenMP workers spin for a while after
    a parallel region, and on a 2-core machine they would otherwise steal the cores from
    whichever variant runs next.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            time.sleep(_SETTLE_SECONDS)
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def _bench_dtype(args: argparse.Namespace, name: str, dtype: torch.dtype) -> list[dict[str, Any]]:
    nl, nh, hs, bs = args.layers, args.heads, args.head_dim, args.block_size
    nb, chunk = args.engine_blocks, args.chunk_tokens
    bpo = chunk // bs
    n_blocks = bpo * args.chunks
    if n_blocks > nb:
        raise SystemExit(f"--engine-blocks must be >= {n_blocks}")
    gen = torch.Generator().manual_seed(0)
    paged = [torch.randn(2, nb, bs, nh, hs, generator=gen).to(dtype) for _ in range(nl)]
    objects = [torch.empty(2, nl, chunk, nh * hs, dtype=dtype) for _ in range(args.chunks)]
    block_ids = torch.randperm(nb, generator=gen)[:n_blocks]
    desc = PageBufferShapeDesc(
        kv_size=2, nl=nl, nb=nb, bs=bs, nh=nh, hs=hs,
        element_size=torch.empty(0, dtype=dtype).element_size(), dtype=dtype,
    )  # fmt: skip
    fmt = EngineKVFormat.NL_X_TWO_NB_BS_NH_HS
    nbytes = sum(o.numel() * o.element_size() for o in objects)
    # Both touched up front: an untouched source maps the shared zero page and would make
    # the memcpy bound look far faster than any real copy.
    flat_src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    flat_dst = torch.zeros(nbytes, dtype=torch.uint8)
    for obj in objects:
        obj.zero_()

    def transfer(op: Callable[..., None], direction: TransferDirection) -> Callable[[], None]:
        return lambda: op(paged, objects, block_ids, "cpu", direction, desc, chunk, fmt, 0)

    rows = []
    for label, direction in (("gather D2H", TransferDirection.D2H),
                             ("scatter H2D", TransferDirection.H2D)):  # fmt: skip
        times = _interleaved_medians(
            {
                "native": transfer(native_ops.multi_layer_block_kv_transfer, direction),
                "baseline": transfer(torch_ops.multi_layer_block_kv_transfer, direction),
                "memcpy": lambda: flat_dst.copy_(flat_src),
            },
            args.iters,
            args.warmup,
        )
        t_native, t_base, t_copy = times["native"], times["baseline"], times["memcpy"]
        rows.append(
            {
                "dtype": name,
                "op": label,
                "bytes": nbytes,
                "native_gbps": nbytes / t_native / 1e9,
                "baseline_gbps": nbytes / t_base / 1e9,
                "memcpy_gbps": nbytes / t_copy / 1e9,
                "native_over_baseline": t_base / t_native,
                "native_over_memcpy": t_copy / t_native,
            }
        )
    return rows


def main() -> int:
    args = _parse()
    rows: list[dict[str, Any]] = []
    for name in args.dtypes.split(","):
        rows.extend(_bench_dtype(args, name.strip(), DTYPES[name.strip()]))
    print(
        f"multi_layer_block_kv_transfer, NL={args.layers} NH={args.heads} HS={args.head_dim} "
        f"BS={args.block_size} chunk={args.chunk_tokens} x{args.chunks}; native threads="
        f"{_native.num_threads()}, torch threads={torch.get_num_threads()}"
    )
    header = f"{'dtype':<6}{'op':<13}{'MiB':>6}{'native':>10}{'baseline':>10}{'memcpy':>10}"
    print(header + f"{'nat/base':>10}{'nat/memcpy':>12}   (GB/s)")
    for r in rows:
        print(
            f"{r['dtype']:<6}{r['op']:<13}{r['bytes'] / 2**20:>6.0f}{r['native_gbps']:>10.2f}"
            f"{r['baseline_gbps']:>10.2f}{r['memcpy_gbps']:>10.2f}"
            f"{r['native_over_baseline']:>9.2f}x{r['native_over_memcpy']:>11.2f}x"
        )
    if args.json:
        meta = {k: v for k, v in vars(args).items() if k != "json"}
        meta["native_threads"] = _native.num_threads()
        meta["torch_threads"] = torch.get_num_threads()
        with open(args.json, "w") as fh:
            json.dump({"config": meta, "results": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
