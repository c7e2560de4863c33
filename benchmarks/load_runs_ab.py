"""Interleaved A/B of the CPU load (H2D) kernel: ``index_copy_`` scatter vs slice copies.

``multi_layer_block_kv_transfer`` loads runs of consecutive engine blocks as slice copies
and scatters the rest (``mp_mem_kernels.consecutive_runs``).  This measures, in one
process and interleaved (forward then reversed order each round, best of ``--rounds``),
for the ``lmcache bench server`` geometry (32 separate layer tensors, 16 objects of 16
blocks of 16 tokens, 4 KV heads x 64, bf16), with consecutive and with random block ids:

- ``memcpy``: one copy of the same bytes (the bound);
- ``scatter``: the kernel with runs disabled (every load through ``index_copy_``);
- ``kernel``: the kernel as shipped;
- ``store``: the store (D2H, ``index_select``) direction of the kernel, for reference.

    python benchmarks/load_runs_ab.py --json load-runs.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent / "packages" / "lmcache-core" / "src")
)

from lmcache.bench._vllm_cpu import conditions
from lmcache.v1.platform.ops_types import (
    EngineKVFormat,
    PageBufferShapeDesc,
    TransferDirection,
)
from lmcache.v1.platform.torch_ops import mp_mem_kernels

LAYERS, BLOCKS, BS, HEADS, HS, OBJECTS, BPO = 32, 1024, 16, 4, 64, 16, 16


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = conditions()
    dtype = torch.bfloat16
    layers = [torch.randn(2, BLOCKS, BS, HEADS, HS).to(dtype) for _ in range(LAYERS)]
    objects = [torch.randn(2, LAYERS, BPO * BS, HEADS * HS).to(dtype) for _ in range(OBJECTS)]
    nbytes = sum(o.numel() * o.element_size() for o in objects)
    desc = PageBufferShapeDesc(
        kv_size=2, nl=LAYERS, nb=BLOCKS, bs=BS, nh=HEADS, hs=HS, element_size=2, dtype=dtype
    )
    src = torch.randn(nbytes // 2).to(dtype)
    dst = torch.empty_like(src)

    def transfer(ids: torch.Tensor, direction: TransferDirection) -> None:
        mp_mem_kernels.multi_layer_block_kv_transfer(
            layers, objects, ids, "cpu", direction, desc, BPO * BS,
            EngineKVFormat.NL_X_TWO_NB_BS_NH_HS, 0,
        )  # fmt: skip

    results = []
    for kind in ("consecutive", "random"):
        n = OBJECTS * BPO
        ids = torch.arange(n) if kind == "consecutive" else torch.randperm(BLOCKS)[:n]

        def scatter(ids: torch.Tensor = ids) -> None:
            with mock.patch.object(mp_mem_kernels, "consecutive_runs", lambda _ids: None):
                transfer(ids, TransferDirection.H2D)

        cases: dict[str, Callable[[], object]] = {
            "memcpy": lambda: dst.copy_(src),
            "scatter": scatter,
            "kernel": lambda ids=ids: transfer(ids, TransferDirection.H2D),
            "store": lambda ids=ids: transfer(ids, TransferDirection.D2H),
        }
        best = dict.fromkeys(cases, float("inf"))
        for fn in cases.values():
            fn()  # warm-up
        for rnd in range(args.rounds):
            order = list(cases) if rnd % 2 == 0 else list(cases)[::-1]
            for name in order:
                t0 = time.perf_counter()
                cases[name]()
                best[name] = min(best[name], time.perf_counter() - t0)
        row = {"ids": kind, "bytes": nbytes}
        for name, seconds in best.items():
            row[f"{name}_gbps"] = round(nbytes / seconds / 1e9, 3)
            row[f"{name}_x_memcpy"] = round(best["memcpy"] / seconds, 3)
        row["kernel_vs_scatter"] = round(best["scatter"] / best["kernel"], 3)
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        doc = {
            "benchmark": "load-runs-ab",
            "config": vars(args),
            "conditions": {"start": started, "end": conditions()},
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "results": results,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
