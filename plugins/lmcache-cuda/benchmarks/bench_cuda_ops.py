"""Native CUDA block transfer vs the torch baseline vs a device-to-host copy bound.

For each layout: D2H (paged GPU cache -> pinned host chunk objects) and H2D, GB/s of KV
bytes moved, and ratios against the baseline and against one contiguous
``cudaMemcpyAsync`` of the same byte count into pinned memory (the PCIe/NVLink-C2C bound).
Prints a table; ``--json PATH`` writes the numbers too. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import torch

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc, TransferDirection

LAYOUTS = {
    "flash_attn_nhd": EngineKVFormat.NL_X_TWO_NB_BS_NH_HS,
    "flashinfer_hnd": EngineKVFormat.NL_X_NB_TWO_NH_BS_HS,
    "mla": EngineKVFormat.NL_X_NB_BS_HS,
    "cross_layer": EngineKVFormat.NB_NL_TWO_BS_NH_HS,
}


def _cache(fmt: EngineKVFormat, nl: int, nb: int, bs: int, nh: int, hs: int) -> Any:
    dt = torch.bfloat16
    if fmt == EngineKVFormat.NB_NL_TWO_BS_NH_HS:
        return torch.randn(nb, nl, 2, bs, nh, hs, device="cuda").to(dt)
    if fmt == EngineKVFormat.NL_X_NB_BS_HS:
        return [torch.randn(nb, bs, hs, device="cuda").to(dt) for _ in range(nl)]
    if fmt == EngineKVFormat.NL_X_NB_TWO_NH_BS_HS:
        return [torch.randn(nb, 2, nh, bs, hs, device="cuda").to(dt) for _ in range(nl)]
    return [torch.randn(2, nb, bs, nh, hs, device="cuda").to(dt) for _ in range(nl)]


def _time_ms(fn: Callable[[], None], iters: int) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def bench_layout(name: str, fmt: EngineKVFormat, args: argparse.Namespace, native: Any) -> dict:
    nl, bs, nh, hs, chunk = args.layers, 16, args.heads, 128, 256
    mla = fmt == EngineKVFormat.NL_X_NB_BS_HS
    heads = 1 if mla else nh
    width = 576 if mla else hs
    nb = args.blocks
    cache = _cache(fmt, nl, nb, bs, heads, width)
    bpo = chunk // bs
    n_obj = args.chunks
    ids = torch.randperm(nb)[: n_obj * bpo]
    shape = (nl, chunk, width) if mla else (2, nl, chunk, heads * width)
    objects = [torch.empty(shape, dtype=torch.bfloat16).pin_memory() for _ in range(n_obj)]
    desc = PageBufferShapeDesc(
        kv_size=1 if mla else 2, nl=nl, nb=nb, bs=bs, nh=heads, hs=width, element_size=2,
        dtype=torch.bfloat16,
    )  # fmt: skip
    nbytes = sum(o.numel() * 2 for o in objects)
    dev = torch.device("cuda", 0)

    def run(ops: Any, direction: Any) -> Callable[[], None]:
        return lambda: ops.multi_layer_block_kv_transfer(
            cache, objects, ids, dev, direction, desc, chunk, fmt, 0
        )

    flat_dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    flat_host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    bound = {
        "D2H": _time_ms(lambda: flat_host.copy_(flat_dev, non_blocking=True), args.iters),
        "H2D": _time_ms(lambda: flat_dev.copy_(flat_host, non_blocking=True), args.iters),
    }
    result: dict[str, Any] = {"layout": name, "bytes": nbytes}
    for label, direction in (("D2H", TransferDirection.D2H), ("H2D", TransferDirection.H2D)):
        t_native = _time_ms(run(native, direction), args.iters)
        t_base = _time_ms(run(torch_ops, direction), max(1, args.iters // 4))
        gbs = {k: nbytes / ms / 1e6 for k, ms in (("native", t_native), ("baseline", t_base))}
        gbs["memcpy_bound"] = nbytes / bound[label] / 1e6
        result[label] = {
            "gbps": gbs,
            "native_vs_baseline": t_base / t_native,
            "native_vs_bound": gbs["native"] / gbs["memcpy_bound"],
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=4096)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark", file=sys.stderr)
        return 2
    from lmcache_cuda.device import CudaDeviceSpec

    native = CudaDeviceSpec().get_ops()
    if native.native_module_name is None:
        print("native kernels are not bound (see the warning above)", file=sys.stderr)
        return 3
    results = [bench_layout(name, fmt, args, native) for name, fmt in LAYOUTS.items()]
    print(f"{'layout':16} {'dir':4} {'native':>9} {'baseline':>9} {'bound':>9} "
          f"{'x base':>7} {'% bound':>8}")  # fmt: skip
    for r in results:
        for label in ("D2H", "H2D"):
            d = r[label]
            g = d["gbps"]
            print(
                f"{r['layout']:16} {label:4} {g['native']:8.1f}G {g['baseline']:8.1f}G "
                f"{g['memcpy_bound']:8.1f}G {d['native_vs_baseline']:6.2f}x "
                f"{100 * d['native_vs_bound']:7.1f}%"
            )
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "results": results}  # fmt: skip
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
