"""The CUDA kernels behind the kit's KV ops: reachability checks and plan execution.

:mod:`lmcache.v1.platform.kernel_kit.ops` declares every KV op (signature, checks,
geometry, fallback to the torch baseline). This module says which memory the CUDA kernels
reach -- engine buffers on a CUDA device, LMCache buffers in device or pinned host memory --
and launches the plans of :mod:`lmcache_cuda._plan` on the caller's current stream. Launches
are asynchronous (the baseline finishes before it returns); callers order later work with
stream events, as on upstream's CUDA backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import lmcache_cuda._native as _native
from lmcache.v1.platform.kernel_kit.checks import Unsupported
from lmcache.v1.platform.kernel_kit.kernels import MemcpyCall, buffer_address
from lmcache_cuda._plan import CopyPlan, PlanKernels


def _stream_handle(device: torch.device) -> int:
    return int(torch.cuda.current_stream(device).cuda_stream)


def _cuda_device(device: Any) -> torch.device:
    dev = torch.device(device)
    if dev.type != "cuda":
        raise Unsupported(f"device {dev} is not a CUDA device")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


class CudaKernels(PlanKernels):
    """``kv_copy`` and ``memcpy_async`` from ``lmcache_cuda._native``."""

    def check_device(self, device: torch.device) -> None:
        _cuda_device(device)

    def check_engine_tensor(self, tensor: torch.Tensor, arg: str) -> None:
        if tensor.device.type != "cuda":
            raise Unsupported(f"{arg} is on {tensor.device}")

    def check_engine_pointers(self, pointers: Sequence[int], device: torch.device) -> None:
        _cuda_device(device)
        if any(_native.pointer_device(int(p)) < 0 for p in pointers):
            raise Unsupported("engine buffer pointers are not device memory")

    def kernel_address(self, address: int) -> int:
        # Device memory maps to itself, registered host memory to its device alias,
        # pageable host memory to 0 (the kit then defers to the baseline).
        return int(_native.device_address(int(address)))

    def execute(self, plans: Sequence[CopyPlan], device: torch.device) -> None:
        """Launch every plan on the current stream of ``device``."""
        device = _cuda_device(device)
        stream = _stream_handle(device)
        for plan in plans:
            if not plan.planes or plan.work.numel() == 0:
                continue
            _native.kv_copy(
                torch.tensor(plan.planes, dtype=torch.int64).to(device),
                plan.work.to(device),
                plan.rows,
                plan.num_heads,
                plan.width_bytes,
                plan.eng_row_stride,
                plan.eng_head_stride,
                plan.obj_row_stride,
                plan.obj_head_stride,
                plan.to_engine,
                plan.vector_bytes(),
                plan.items_per_cta(),
                stream,
            )

    def memcpy(self, job: MemcpyCall) -> None:
        """``cudaMemcpyAsync`` on the current stream, split at host registration boundaries.

        The host side is registered in ``host_buffer_alignments``-byte segments starting at
        allocator offset ``host_buffer_offset``; no single copy crosses a segment boundary.
        """
        tensors = [b for b in (job.dest, job.src) if isinstance(b, torch.Tensor)]
        if len(tensors) == 2 and all(t.device.type != "cuda" for t in tensors):
            raise Unsupported("no device involved: the baseline's host copy")
        dest_ptr = buffer_address(job.dest, job.nbytes, "dest")
        src_ptr = buffer_address(job.src, job.nbytes, "src")
        on_device = [t.device.index for t in tensors if t.device.type == "cuda"]
        index = on_device[0] if on_device and on_device[0] is not None else None
        device = torch.device("cuda", index if index is not None else torch.cuda.current_device())
        _native.memcpy_async(
            dest_ptr,
            src_ptr,
            job.nbytes,
            int(job.direction),
            job.host_buffer_offset,
            job.host_buffer_alignments,
            _stream_handle(device),
        )
