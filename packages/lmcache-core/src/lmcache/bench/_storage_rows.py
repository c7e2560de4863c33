"""What ``lmcache bench storage`` and its local tiers (:mod:`lmcache.bench._storage_local`)
share: the dtype choices, the chunk shape and the result row.  Kept apart so that neither
module imports the other."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class Row:
    backend: str
    op: str
    chunk_mib: float
    chunks: int
    tier_gbps: float
    raw_gbps: float

    @property
    def ratio(self) -> float:
        return self.tier_gbps / self.raw_gbps


def chunk_shape(args: argparse.Namespace) -> torch.Size:
    """``[2, layers, chunk_tokens, kv_heads * head_dim]`` of the benchmark's chunks."""
    return torch.Size([2, args.layers, args.chunk_tokens, args.kv_heads * args.head_dim])
