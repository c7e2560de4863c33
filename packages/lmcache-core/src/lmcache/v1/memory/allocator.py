"""The host allocator: a buddy allocator over one preallocated (optionally shared) buffer.

:class:`HostMemoryAllocator` hands out :class:`~lmcache.v1.memory.objects.TensorMemoryObj`
views of its buffer; with shared memory the buffer is a POSIX segment made by
:mod:`lmcache.v1.memory.shm`, so other processes can map the same bytes.
"""

from __future__ import annotations

import logging
import mmap
import threading
from dataclasses import dataclass
from typing import Any

import torch

from lmcache.v1.memory.base import HostBufferAllocator, MemoryObj, MemoryObjMetadata
from lmcache.v1.memory.buddy import BuddySpace
from lmcache.v1.memory.format import (
    DtypesArg,
    MemoryFormat,
    ShapesArg,
    normalize_shapes_dtypes,
    part_offsets,
)
from lmcache.v1.memory.objects import TensorMemoryObj
from lmcache.v1.memory.shm import (
    create_host_segment,
    release_host_segment,
    reserve_host_segment_range,
)

logger = logging.getLogger(__name__)

HUGEPAGE_BYTES = 2 * 1024 * 1024
# Linux's MAP_HUGETLB (Python's mmap module names it only from 3.12 on some builds).
_MAP_HUGETLB = getattr(mmap, "MAP_HUGETLB", 0x40000)
_HUGEPAGES_FREE = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"
# A lazy L1 grows by this much at a time (reserved and touched before it is handed out).
LAZY_GROW_STEP_BYTES = 256 * 1024**2


@dataclass
class FreeBlock:
    """A free byte range ``[start, start + size)``."""

    start: int
    size: int

    def can_be_coalesced(self, succ: FreeBlock) -> bool:
        return self.start + self.size == succ.start


class HostMemoryAllocator(HostBufferAllocator):
    """Buddy allocator over one preallocated host buffer, optionally POSIX shared memory.

    Placement is :class:`~lmcache.v1.memory.buddy.BuddySpace` (first-fit buddy, no
    power-of-two rounding) in units of ``min_block_size``.
    Internal waste is below ``min_block_size`` per object, and all free space coalesces
    back into one block when the objects are gone (``memcheck`` verifies the tiling).
    """

    def __init__(
        self,
        size: int,
        min_block_size: int = 256,
        use_shm: bool = False,
        shm_name: str | None = None,
        pin_memory: bool = False,
        *,
        init_size: int | None = None,
        use_hugepages: bool = False,
    ) -> None:
        """``min_block_size`` is also the alignment of every object's offset.  With
        ``init_size`` below ``size`` the allocator is lazy: only ``init_size`` bytes are
        reserved and handed out at first; :meth:`grow` (called on demand by
        :meth:`allocate` and by a background grower, :meth:`start_growing`) adds the rest
        in steps, each reserved before use.  ``use_hugepages`` maps the buffer from the
        2 MiB hugepage pool (private memory only)."""
        if min_block_size <= 0 or min_block_size & (min_block_size - 1):
            raise ValueError(f"min_block_size must be a power of two, got {min_block_size}")
        if size < min_block_size:
            raise ValueError(f"allocator size {size} smaller than one block ({min_block_size})")
        self._unit = min_block_size
        self._total_units = size // min_block_size
        self._size = self._total_units * min_block_size
        init_units = self._total_units
        if init_size is not None:
            init_units = max(1, min(self._total_units, -(-init_size // min_block_size)))
        self._space = BuddySpace(init_units)
        self._allocated: dict[int, int] = {}  # start unit -> length in units
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._grow_lock = threading.Lock()  # one growth at a time; never held with _lock
        self._grower: threading.Thread | None = None
        self._closing = threading.Event()
        self.counter_lock = threading.Lock()
        self.shm_name: str | None = None
        self._owned_segment: str | None = None
        self._hugepage_map: mmap.mmap | None = None
        shared = use_shm or shm_name is not None
        if use_hugepages:
            if shared:
                raise ValueError(
                    "--l1-use-hugepages needs private memory and L1 is in shared memory: "
                    "pass --shm-name '' (as upstream, hugepages and SHM do not mix)"
                )
            self.buffer = self._hugepage_buffer()
        else:
            self.buffer = self._make_buffer(shared, shm_name, pin_memory, init_units * self._unit)

    def _hugepage_buffer(self) -> torch.Tensor:
        """The whole buffer from the 2 MiB hugepage pool, refused at once if the pool is
        short (a MAP_HUGETLB mapping that the pool cannot back fails here, not later)."""
        length = -(-self._size // HUGEPAGE_BYTES) * HUGEPAGE_BYTES
        needed = length // HUGEPAGE_BYTES
        free = free_hugepages()
        if free is not None and free < needed:
            raise RuntimeError(
                f"--l1-use-hugepages: {free} free 2 MiB hugepages, {needed} needed for "
                f"{self._size} bytes of L1; grow the pool (sysctl vm.nr_hugepages={needed})"
            )
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_HUGETLB
        try:
            self._hugepage_map = mmap.mmap(-1, length, flags=flags)
        except OSError as exc:
            raise RuntimeError(
                f"--l1-use-hugepages: cannot map {length} bytes of 2 MiB hugepages "
                f"({exc.strerror or exc}); check vm.nr_hugepages"
            ) from None
        return torch.frombuffer(self._hugepage_map, dtype=torch.uint8, count=self._size)

    def _make_buffer(
        self, use_shm: bool, shm_name: str | None, pin_memory: bool, reserve: int
    ) -> torch.Tensor:
        if not use_shm:
            buf = torch.empty(self._size, dtype=torch.uint8)
            if pin_memory and torch.cuda.is_available():
                buf = buf.pin_memory()
            elif pin_memory:
                logger.debug("pin_memory requested without an accelerator; using pageable memory")
            return buf
        self.shm_name, buffer = create_host_segment(self._size, shm_name, reserve=reserve)
        self._owned_segment = self.shm_name
        return buffer

    @staticmethod
    def from_config(
        config: Any,
        shm_name: str | None = None,
        *,
        align_bytes: int = 256,
        init_size: int | None = None,
        use_hugepages: bool = False,
    ) -> HostMemoryAllocator:
        """Allocator of ``config.max_local_cpu_size`` GB (shared memory when named)."""
        size = int(config.max_local_cpu_size * 1024**3)
        extra = getattr(config, "extra_config", None) or {}
        shm = shm_name or extra.get("local_cpu.shm_name")
        return HostMemoryAllocator(
            size,
            min_block_size=align_bytes,
            use_shm=bool(shm) or bool(extra.get("local_cpu.use_shm", False)),
            shm_name=shm or None,
            pin_memory=bool(extra.get("local_cpu.pin_memory", False)),
            init_size=init_size,
            use_hugepages=use_hugepages,
        )

    # -- public API -------------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        return self._size

    @property
    def used_bytes(self) -> int:
        return self._space.used_units * self._unit

    @property
    def usable_bytes(self) -> int:
        """Bytes the allocator hands out now: ``capacity_bytes`` once a lazy allocator
        has grown all the way."""
        return self._space.total_units * self._unit

    @property
    def align_bytes(self) -> int:
        return self._unit

    @property
    def uses_hugepages(self) -> bool:
        return self._hugepage_map is not None

    def grow(self, min_bytes: int = 0) -> bool:
        """Make at least ``min_bytes`` (and one step) more of the buffer usable; False when
        it is all usable already.  The new range is reserved (shared memory) and touched
        before the allocator hands it out, so a full ``/dev/shm`` is an error here, never
        a SIGBUS in a later copy."""
        with self._grow_lock:
            old_units = self._space.total_units
            if old_units >= self._total_units:
                return False
            step = max(min_bytes, LAZY_GROW_STEP_BYTES)
            new_units = min(self._total_units, old_units + -(-step // self._unit))
            start, end = old_units * self._unit, new_units * self._unit
            if self._owned_segment is not None:
                reserve_host_segment_range(self._owned_segment, start, end - start)
            self.buffer[start:end].fill_(0)  # first touch now, not inside a store's copy
            with self._lock:
                self._space.grow(new_units)
                self._freed.notify_all()
            logger.debug("L1 grew to %d of %d bytes", end, self._size)
            return True

    def start_growing(self) -> None:
        """Grow to the full size in the background (upstream's lazy L1 does the same)."""
        if self._grower is not None or self.usable_bytes >= self._size:
            return
        self._grower = threading.Thread(target=self._grow_all, name="lmc-l1-grow", daemon=True)
        self._grower.start()

    def _grow_all(self) -> None:
        try:
            while not self._closing.is_set() and self.grow():
                pass
        except OSError:
            logger.exception("L1 stays at %d bytes: growing it failed", self.usable_bytes)

    @property
    def num_allocated(self) -> int:
        return len(self._allocated)

    def allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> TensorMemoryObj | None:
        shape_list, dtype_list = normalize_shapes_dtypes(shapes, dtypes)
        nbytes = part_offsets(shape_list, dtype_list)[-1]
        units = max(1, -(-nbytes // self._unit))
        if units > self._total_units:
            return None
        while True:
            with self._lock:
                start = self._space.take(units)
                if start is not None:
                    self._allocated[start] = units
                    break
            # Lazy: a request the grown part cannot place grows it before anyone evicts.
            if not self._grow_on_demand(units * self._unit):
                return None
        multi = len(shape_list) > 1
        meta = MemoryObjMetadata(
            shape=shape_list[0],
            dtype=dtype_list[0],
            address=start * self._unit,
            phy_size=units * self._unit,
            ref_count=1,
            fmt=fmt,
            shapes=shape_list if multi else None,
            dtypes=dtype_list if multi else None,
        )
        return TensorMemoryObj(None, meta, self)

    def free(self, memory_obj: MemoryObj, allocator_type: str | None = None) -> None:
        start = memory_obj.metadata.address // self._unit
        with self._lock:
            units = self._allocated.pop(start, None)
            if units is None:
                logger.error("free of an object this allocator does not own (double free?)")
                return
            self._space.give(start, units)
            self._freed.notify_all()
        memory_obj.invalidate()

    def _grow_on_demand(self, nbytes: int) -> bool:
        try:
            return self.grow(nbytes)
        except OSError:
            logger.warning("cannot grow L1 past %d bytes", self.usable_bytes, exc_info=True)
            return False

    def wait_for_free(self, timeout: float) -> bool:
        with self._freed:
            return self._freed.wait(timeout)

    def largest_free_block(self) -> int:
        with self._lock:
            return self._space.largest_free_units() * self._unit

    def memcheck(self) -> bool:
        """Free blocks and live objects tile the buffer exactly, with no buddy left unmerged."""
        with self._lock:
            return self._space.is_consistent(self._allocated.items())

    def close(self) -> None:
        self._closing.set()
        if self._grower is not None:
            self._grower.join()
        if self._allocated:
            logger.warning("closing allocator with %d live objects", len(self._allocated))
        if self._owned_segment is not None:
            release_host_segment(self._owned_segment)
            self._owned_segment = None

    def __enter__(self) -> HostMemoryAllocator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def free_hugepages() -> int | None:
    """Free pages in the 2 MiB hugepage pool (None when the kernel does not say)."""
    try:
        with open(_HUGEPAGES_FREE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None
