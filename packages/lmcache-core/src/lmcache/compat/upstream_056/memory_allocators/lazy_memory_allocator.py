"""Upstream's ``LazyMemoryAllocator(init_size, final_size, align_bytes, numa_mapping)``.

A large host buffer takes seconds to page-lock (CUDA host registration), so this allocator
reserves the whole ``final_size`` buffer up front but lets objects use only a committed
prefix of it: ``init_size`` at once, then ``PIN_CHUNK_SIZE`` more at a time as a background
thread registers each chunk.  Objects are placed by
:class:`~upstream_056.memory_allocators.tensor_memory_allocator.TensorMemoryAllocator` (the
buddy core) over the committed prefix, whose address space grows in place: nothing is ever
moved or reallocated, so objects handed out before an expansion stay valid.

Differences from upstream, all deliberate:
  * without CUDA there is nothing to page-lock: the chunks are ordinary memory and the
    background thread only commits them (upstream refuses to start on such a platform);
  * each chunk is committed as soon as it is registered (upstream commits every 1 GiB),
    so ``COMMIT_SIZE`` does not exist; ``PIN_CHUNK_SIZE`` and ``LOG_INTERVAL`` keep
    upstream's meaning and values;
  * ``init_size`` must be positive and ``final_size`` at least ``init_size``
    (ValueError); ``numa_mapping`` (NUMA-bound buffers) is refused with ValueError;
  * there is no ``get_address_manager()`` (no separate address manager exists here);
    :attr:`committed_bytes`, :attr:`final_size` and :meth:`wait_until_expanded` are
    additions;
  * ``close()`` may be called more than once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch

from lmcache.compat.upstream_056.host_buffers import align_to, cuda_status
from lmcache.compat.upstream_056.memory_allocators.tensor_memory_allocator import (
    TensorMemoryAllocator,
)
from lmcache.v1.memory.base import MemoryAllocatorInterface, MemoryObj
from lmcache.v1.memory.format import DtypesArg, MemoryFormat, ShapesArg

logger = logging.getLogger(__name__)

# align_to stays importable from here, upstream's module.
__all__ = ["LazyMemoryAllocator", "align_to"]


def _aligned_host_buffer(size: int, align_bytes: int) -> torch.Tensor:
    """``size`` bytes of pageable host memory whose first byte is aligned to ``align_bytes``.

    torch only promises 64-byte aligned storage, so the buffer is cut out of a slightly
    larger one; the slice keeps the whole storage alive.  Pages are not touched here.
    """
    backing = torch.empty(size + align_bytes - 1, dtype=torch.uint8)
    skip = -backing.data_ptr() % align_bytes
    buffer = backing[skip : skip + size]
    if buffer.data_ptr() % align_bytes:
        raise RuntimeError(f"could not align a host buffer to {align_bytes} bytes")
    return buffer


class LazyMemoryAllocator(MemoryAllocatorInterface):
    """Objects in a host buffer that is page-locked and committed chunk by chunk."""

    PIN_CHUNK_SIZE = 1 << 26  # 64 MiB registered (and committed) per step
    LOG_INTERVAL = 10 << 30  # INFO progress at most once per 10 GiB committed

    def __init__(
        self,
        init_size: int,
        final_size: int,
        align_bytes: int = TensorMemoryAllocator.ALIGN_BYTES,
        numa_mapping: Any = None,
    ) -> None:
        """Reserve ``final_size`` bytes, commit ``init_size`` now and the rest in the background.

        Both sizes are rounded up to ``PIN_CHUNK_SIZE``.  ``align_bytes`` (a positive power
        of two, else ValueError) aligns the buffer's base and every object in it.
        """
        if align_bytes <= 0 or align_bytes & (align_bytes - 1):
            raise ValueError(f"align_bytes must be a positive power of two, got {align_bytes}")
        if numa_mapping is not None:
            raise ValueError("NUMA-bound buffers (numa_mapping) are not supported")
        if init_size <= 0 or final_size < init_size:
            raise ValueError(
                f"need 0 < init_size <= final_size, got init_size={init_size}, "
                f"final_size={final_size}"
            )
        chunk = self.PIN_CHUNK_SIZE
        self._final_size = align_to(final_size, chunk)
        self._committed = align_to(init_size, chunk)
        self._buffer = _aligned_host_buffer(self._final_size, align_bytes)
        self._use_cuda = torch.cuda.is_available()
        self._registered: list[int] = []  # starts of the ranges registered with CUDA
        self._lock_pages(0, self._committed)
        self._allocator = TensorMemoryAllocator(
            self._buffer, align_bytes, self._committed, parent_allocator=self
        )
        self._stop = threading.Event()
        self._finished = threading.Event()  # the expansion is over, done or not
        self._closed = False
        self._thread: threading.Thread | None = None
        if self._committed >= self._final_size:
            self._finished.set()
        else:
            self._thread = threading.Thread(
                target=self._expand, name="lazy-mem-expand-thread", daemon=True
            )
            self._thread.start()

    # -- sizes ------------------------------------------------------------------------

    @property
    def final_size(self) -> int:
        """Bytes reserved (``final_size`` rounded up to ``PIN_CHUNK_SIZE``)."""
        return self._final_size

    @property
    def committed_bytes(self) -> int:
        """Bytes of the buffer's start that objects may use now."""
        return self._committed

    @property
    def capacity_bytes(self) -> int:
        """What can be handed out now: the committed prefix in whole ``align_bytes`` units."""
        return self._allocator.capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self._allocator.used_bytes

    def wait_until_expanded(self, timeout: float | None = None) -> bool:
        """Block until the whole buffer is committed; False on timeout or if it never will be
        (closed, or the expansion failed)."""
        return self._finished.wait(timeout) and self._committed >= self._final_size

    def get_underlying_buffer(self) -> torch.Tensor:
        """The whole reserved buffer (for registering it with RDMA and the like)."""
        return self._buffer

    # -- objects ----------------------------------------------------------------------

    def allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        fmt: MemoryFormat = MemoryFormat.UNDEFINED,
        allocator_type: str | None = None,
    ) -> MemoryObj | None:
        """One object in the committed prefix, or None when it does not fit there (yet)."""
        return self._allocator.allocate(shapes, dtypes, fmt, allocator_type)

    def batched_allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        batch_size: int,
        fmt: MemoryFormat = MemoryFormat.UNDEFINED,
        allocator_type: str | None = None,
    ) -> list[MemoryObj] | None:
        """``batch_size`` objects, or None (nothing taken) if they do not all fit now."""
        return self._allocator.batched_allocate(shapes, dtypes, batch_size, fmt, allocator_type)

    def free(self, memory_obj: MemoryObj, allocator_type: str | None = None) -> None:
        """Give an object back; freeing it again (or a foreign object) does nothing."""
        self._allocator.free(memory_obj, allocator_type)

    def batched_free(
        self,
        memory_objs: Sequence[MemoryObj],
        allocator_type: str | None = None,
        update_stats: bool = True,
    ) -> None:
        self._allocator.batched_free(memory_objs, allocator_type, update_stats)

    def memcheck(self) -> bool:
        return self._allocator.memcheck()

    def close(self) -> None:
        """Stop the expansion (the current chunk finishes), join the thread, unregister pages.

        The buffer itself is freed when the last view of it (objects included) is gone.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._closed:
            return
        self._closed = True
        if self._registered:
            torch.cuda.synchronize()
            for ptr in self._registered:
                status = cuda_status(torch.cuda.cudart().cudaHostUnregister(ptr))
                if status:
                    logger.warning("cudaHostUnregister(%#x) failed with error %d", ptr, status)
            self._registered.clear()
        self._allocator.close()

    # -- background expansion ---------------------------------------------------------

    def _lock_pages(self, offset: int, size: int) -> None:
        """Page-lock ``size`` bytes at ``offset`` of the buffer (nothing to do without CUDA).

        A failed registration only costs copy speed, so it is logged and not raised.
        """
        if not self._use_cuda or size == 0:
            return
        ptr = self._buffer.data_ptr() + offset
        status = cuda_status(torch.cuda.cudart().cudaHostRegister(ptr, size, 0))
        if status:
            logger.warning(
                "cudaHostRegister of %d bytes at %#x failed with error %d; copies from "
                "this range will be slower",
                size,
                ptr,
                status,
            )
        else:
            self._registered.append(ptr)

    def _expand(self) -> None:
        chunk = self.PIN_CHUNK_SIZE
        since_log = 0
        try:
            while not self._stop.is_set() and self._committed < self._final_size:
                self._lock_pages(self._committed, chunk)
                self._committed = self._allocator.extend_address_space(chunk)
                since_log += chunk
                done = self._committed >= self._final_size
                if since_log >= self.LOG_INTERVAL or done:
                    logger.info(
                        "LazyMemoryAllocator: committed %d MiB more, %d of %d MiB (%.1f%%)",
                        since_log >> 20,
                        self._committed >> 20,
                        self._final_size >> 20,
                        100.0 * self._committed / self._final_size,
                    )
                    since_log = 0
        except Exception:
            logger.exception(
                "LazyMemoryAllocator: expansion stopped at %d of %d bytes",
                self._committed,
                self._final_size,
            )
        finally:
            self._finished.set()

    def __str__(self) -> str:
        return "LazyMemoryAllocator"
