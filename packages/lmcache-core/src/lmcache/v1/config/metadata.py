"""``LMCacheMetadata``: what the storage tiers need to know about the model and worker."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class LMCacheMetadata:
    """What the storage tiers need to know about the model and this worker.

    ``kv_shape`` is ``(num_layers, 2, chunk_size, num_kv_heads, head_size)`` as upstream;
    for MLA models the second entry is 1.
    """

    model_name: str
    world_size: int = 1
    worker_id: int = 0
    kv_dtype: torch.dtype = torch.bfloat16
    kv_shape: tuple[int, ...] = (1, 2, 256, 1, 128)
    use_mla: bool = False
    chunk_size: int = 256
    fmt: str = "vllm"
    role: str = "worker"
    extra: dict[str, Any] = field(default_factory=dict)

    def chunk_shape(self, num_tokens: int | None = None) -> torch.Size:
        """Shape of one chunk in the layout the tiers store (KV_2LTD or KV_MLA_FMT)."""
        tokens = self.chunk_size if num_tokens is None else num_tokens
        num_layers, _, _, heads, head_size = self.kv_shape
        if self.use_mla:
            return torch.Size([1, num_layers, tokens, head_size])
        return torch.Size([2, num_layers, tokens, heads * head_size])

    def chunk_bytes(self) -> int:
        return self.chunk_shape().numel() * self.kv_dtype.itemsize

    def replace(self, **changes: Any) -> LMCacheMetadata:
        return dataclasses.replace(self, **changes)
