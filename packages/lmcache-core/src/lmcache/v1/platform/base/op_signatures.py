"""The static type of each KV op that ``DeviceOps`` delegates to the torch baseline.

At run time those methods take the baseline function's signature (``DeviceOps`` builds them
from :mod:`lmcache.v1.platform.torch_ops`, which ``base`` reaches only through the
registry).  Type checkers cannot follow that, so each op's call signature is spelled here
as a callback protocol; ``tests/v1/platform/test_op_signatures.py`` fails when one of them
drifts from the baseline function it describes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc, TransferDirection

__all__ = [
    "LoadAndReshapeFlash",
    "LmcacheMemcpyAsync",
    "MultiLayerBlockKVTransfer",
    "MultiLayerKVTransfer",
    "MultiLayerKVTransferUnilateral",
    "ReshapeAndCacheBackFlash",
    "SingleLayerKVTransfer",
    "SingleLayerKVTransferSgl",
]


class MultiLayerBlockKVTransfer(Protocol):
    def __call__(
        self,
        paged_buffer_ptrs_tensor: torch.Tensor | list,
        lmcache_objects_ptrs: list[int] | list[torch.Tensor],
        block_ids: torch.Tensor | Sequence[int],
        device: torch.device | str,
        direction: TransferDirection,
        shape_desc: PageBufferShapeDesc,
        lmcache_chunk_size: int,
        engine_kv_format: EngineKVFormat,
        skip_prefix_n_blocks: int,
    ) -> None: ...


class MultiLayerKVTransfer(Protocol):
    def __call__(
        self,
        key_value: torch.Tensor,
        key_value_ptrs: torch.Tensor | list[torch.Tensor],
        slot_mapping: torch.Tensor,
        paged_memory_device: torch.device,
        page_buffer_size: int,
        direction: TransferDirection,
        engine_kv_format: EngineKVFormat,
        block_size: int = 0,
        head_size: int = 0,
        skip_prefix_n_tokens: int = 0,
        block_stride_elems: int = 0,
    ) -> None: ...


class MultiLayerKVTransferUnilateral(Protocol):
    def __call__(
        self,
        key_value: torch.Tensor,
        key_value_ptrs: torch.Tensor | list[torch.Tensor],
        slot_mapping: torch.Tensor,
        paged_memory_device: torch.device,
        page_buffer_size: int,
        direction: TransferDirection,
        engine_kv_format: EngineKVFormat,
    ) -> None: ...


class SingleLayerKVTransfer(Protocol):
    def __call__(
        self,
        lmc_key_value_cache: torch.Tensor,
        vllm_key_value_cache: torch.Tensor | Sequence[torch.Tensor],
        slot_mapping: torch.Tensor,
        direction: TransferDirection,
        engine_kv_format: EngineKVFormat,
        token_major: bool = False,
    ) -> None: ...


class SingleLayerKVTransferSgl(Protocol):
    def __call__(
        self,
        lmc_key_value_cache: torch.Tensor,
        sgl_key_cache: torch.Tensor,
        sgl_value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        direction: TransferDirection,
        token_major: bool = False,
    ) -> None: ...


class LoadAndReshapeFlash(Protocol):
    def __call__(
        self,
        key_value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        layer_idx: int,
    ) -> None: ...


class ReshapeAndCacheBackFlash(Protocol):
    def __call__(
        self,
        key_value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        layer_idx: int,
    ) -> None: ...


class LmcacheMemcpyAsync(Protocol):
    def __call__(
        self,
        dest: int | torch.Tensor,
        src: int | torch.Tensor,
        nbytes: int,
        direction: TransferDirection,
        host_buffer_offset: int,
        host_buffer_alignments: int,
        /,
    ) -> None: ...
