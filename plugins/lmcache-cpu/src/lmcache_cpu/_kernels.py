"""The host kernels behind the kit's KV ops, plus the CPU-only codec and batch-copy ops.

:mod:`lmcache.v1.platform.kernel_kit.ops` declares every KV op (signature, checks,
geometry, fallback to the torch baseline); this module only executes the copies it has
described, in ``lmcache_cpu._native`` with the GIL released there. Two deliberate
differences from the baseline (``strict_layout``): an out-of-range block id or slot raises
``KVIndexError`` (an ``IndexError`` that is also a ``ValueError``), and a non-contiguous
LMCache buffer or engine head dimension raises ``ValueError`` naming the argument instead
of being copied slowly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from lmcache.v1.platform.kernel_kit.checks import BlockSummary, SlotSummary, Unsupported
from lmcache.v1.platform.kernel_kit.kernels import (
    BlockCopy,
    KVKernels,
    MemcpyCall,
    SlotCopy,
    buffer_address,
)
from lmcache_cpu import _native

# Symbol dtypes the native CDF reads directly; anything else is converted like the baseline.
_CDF_NATIVE_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_CDF_TOTAL = 32767


def _host_only(device: torch.device, what: str) -> None:
    if device.type != "cpu":
        raise Unsupported(f"{what} is on {device}")


class CpuKernels(KVKernels):
    """Host memory only; everything else is the baseline's."""

    strict_layout: ClassVar[bool] = True

    def check_device(self, device: torch.device) -> None:
        # The block op's device names where pointer buffers live; tensors are vetted alone.
        return None

    def check_engine_tensor(self, tensor: torch.Tensor, arg: str) -> None:
        _host_only(tensor.device, arg)

    def check_lmcache_tensor(self, tensor: torch.Tensor, arg: str) -> None:
        _host_only(tensor.device, arg)

    def check_engine_pointers(self, pointers: Sequence[int], device: torch.device) -> None:
        _host_only(device, "raw-pointer engine buffers")

    def block_summary(self, block_ids: torch.Tensor, skip: int, bpo: int) -> BlockSummary:
        return BlockSummary(*_native.block_summary(block_ids, skip, bpo))

    def slot_summary(self, slots: torch.Tensor, skip: int) -> SlotSummary:
        return SlotSummary(*_native.slot_summary(slots, skip))

    def copy_blocks(self, job: BlockCopy) -> None:
        # strict_layout guarantees contiguous objects: address and token count describe them.
        geom = job.geom
        obj_ptrs = [0 if o is None else o.address for o in job.objects]
        obj_tokens = [0 if o is None else o.tokens for o in job.objects]
        es = geom.itemsize
        for group in geom.groups:
            _native.block_kv_copy(
                group.bases,
                group.block_stride * es,
                group.tok_stride * es,
                group.head_stride * es,
                geom.num_blocks,
                geom.block_size,
                geom.num_heads,
                group.width * es,
                obj_ptrs,
                obj_tokens,
                [kv * geom.num_layers + layer for kv, layer in zip(group.kv, group.layers)],
                [col * es for col in group.cols],
                geom.row_elems * es,
                geom.head_width * es,
                job.block_ids,
                job.skip,
                job.blocks_per_object,
                job.to_engine,
            )

    def copy_slots(self, job: SlotCopy) -> None:
        geom, lmcache = job.geom, job.lmcache
        es = geom.itemsize
        if lmcache.head_stride != geom.head_width * es:
            raise Unsupported("LMCache heads are not packed inside a row")
        for group in geom.groups:
            lmc_bases = [
                lmcache.plane_address(kv, layer, col * es)
                for kv, layer, col in zip(group.kv, group.layers, group.cols)
            ]
            _native.slot_kv_copy(
                group.bases,
                group.block_stride * es,
                group.tok_stride * es,
                group.head_stride * es,
                geom.num_blocks,
                geom.block_size,
                geom.num_heads,
                group.width * es,
                lmc_bases,
                lmcache.row_stride,
                geom.head_width * es,
                job.slots,
                job.skip,
                job.to_engine,
            )

    def memcpy(self, job: MemcpyCall) -> None:
        # Like the baseline on CPU, the copy has completed when the call returns; the host
        # buffer offset and alignment only matter to device runtimes.
        for buffer, arg in ((job.dest, "dest"), (job.src, "src")):
            if isinstance(buffer, torch.Tensor):
                _host_only(buffer.device, arg)
        dest = buffer_address(job.dest, job.nbytes, "dest")
        _native.memcpy(dest, buffer_address(job.src, job.nbytes, "src"), job.nbytes)


def batched_memcpy(src_ptrs: Sequence[int], dst_ptrs: Sequence[int], sizes: Sequence[int]) -> None:
    """Copy ``sizes[i]`` bytes from ``src_ptrs[i]`` to ``dst_ptrs[i]`` (all checked first)."""
    if not len(src_ptrs) == len(dst_ptrs) == len(sizes):
        raise ValueError(
            f"batched_memcpy needs equal lengths, got {len(src_ptrs)} sources, "
            f"{len(dst_ptrs)} destinations and {len(sizes)} sizes"
        )
    for size in sizes:
        if size < 0:
            raise ValueError(f"negative copy size {size}")
    _native.batched_memcpy(
        [int(p) for p in dst_ptrs], [int(p) for p in src_ptrs], [int(s) for s in sizes]
    )


def calculate_cdf(input_tensor: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Native ``calculate_cdf``: int16 ``[L, C, num_bins + 1]``, bit-exact with the baseline."""
    if input_tensor.dim() != 3:
        raise ValueError(
            f"input_tensor must be [nlayers, ntokens, nchannels], got {input_tensor.shape}"
        )
    if not 0 < num_bins <= _CDF_TOTAL // 2:
        raise ValueError(f"num_bins must be in [1, {_CDF_TOTAL // 2}], got {num_bins}")
    symbols = input_tensor
    if symbols.device.type != "cpu" or symbols.dtype not in _CDF_NATIVE_DTYPES:
        symbols = symbols.to("cpu", torch.int64)
    layers, _tokens, channels = symbols.shape
    out = torch.empty(layers, channels, num_bins + 1, dtype=torch.int16)
    _native.calculate_cdf_into(symbols.detach(), int(num_bins), out)
    return out
