"""Memory objects and host allocators.

A :class:`MemoryObj` is a view of bytes that hold one chunk of KV cache (or any binary
payload) together with its metadata, a reference count and a pin count.  Allocators hand
out memory objects carved from one preallocated buffer; dropping the last reference gives
the bytes back to the allocator.

Reference counting protocol (shared by every storage tier):
  * ``allocate`` returns an object with ``ref_count == 1`` owned by the caller;
  * a tier that keeps the object (``batched_submit_put_task``) takes its own reference;
  * ``get_blocking`` returns an object with one extra reference owned by the caller;
  * whoever owns a reference calls ``ref_count_down()`` exactly once when done.
An object whose only reference is the cache's (``ref_count == 1``) and whose pin count is
zero can be evicted (:attr:`MemoryObj.can_evict`).
"""

from __future__ import annotations

import abc
import bisect
import logging
import math
import os
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from lmcache.utils import dtype_to_str, str_to_dtype

logger = logging.getLogger(__name__)


class MemoryFormat(Enum):
    """Layout of the tensor held by a memory object."""

    UNDEFINED = 0
    # [2, num_layers, num_tokens, hidden_dim]
    KV_2LTD = 1
    # [num_tokens, 2, hidden_dim]
    KV_T2D = 2
    # [2, num_tokens, hidden_dim]
    KV_2TD = 3
    # compressed binary array
    BINARY = 4
    # raw byte buffer
    BINARY_BUFFER = 5
    # [1, num_layers, num_tokens, aligned_head_size]
    KV_MLA_FMT = 6
    # [num_tokens, hidden_dim] (encoder cache)
    EC_TD = 7
    # [num_tokens, hidden_dim] (hidden-state store)
    HS_TD = 8

    def token_dim(self) -> int:
        """Index of the token dimension in this layout."""
        return _TOKEN_DIMS[self]


_TOKEN_DIMS: dict[MemoryFormat, int] = {
    MemoryFormat.UNDEFINED: 0,
    MemoryFormat.KV_2LTD: 2,
    MemoryFormat.KV_T2D: 1,
    MemoryFormat.KV_2TD: 0,
    MemoryFormat.BINARY: 0,
    MemoryFormat.BINARY_BUFFER: 0,
    MemoryFormat.KV_MLA_FMT: 2,
    MemoryFormat.EC_TD: 0,
    MemoryFormat.HS_TD: 0,
}

ShapesArg = torch.Size | Sequence[torch.Size]
DtypesArg = torch.dtype | Sequence[torch.dtype]


def normalize_shapes_dtypes(
    shapes: ShapesArg | Sequence[int], dtypes: DtypesArg
) -> tuple[list[torch.Size], list[torch.dtype]]:
    """Lists of ``torch.Size`` and dtypes of equal length from the flexible arguments."""
    if isinstance(shapes, torch.Size) or (
        isinstance(shapes, Sequence) and all(isinstance(s, int) for s in shapes)
    ):
        shape_list = [torch.Size(shapes)]  # type: ignore[arg-type]
    else:
        shape_list = [torch.Size(s) for s in shapes]  # type: ignore[arg-type,union-attr]
    dtype_list = [dtypes] if isinstance(dtypes, torch.dtype) else list(dtypes)
    if len(dtype_list) == 1 and len(shape_list) > 1:
        dtype_list = dtype_list * len(shape_list)
    if len(shape_list) != len(dtype_list) or not shape_list:
        raise ValueError(f"{len(shape_list)} shapes but {len(dtype_list)} dtypes")
    return shape_list, dtype_list


def tensor_nbytes(shape: torch.Size, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


# Parts of a multi-tensor object start on this boundary so each can be viewed in its dtype.
PART_ALIGNMENT = 64


def part_offsets(shapes: Sequence[torch.Size], dtypes: Sequence[torch.dtype]) -> list[int]:
    """Byte offset of each part of a multi-tensor object; the last entry is the total size."""
    if len(shapes) == 1:
        return [0, shapes[0].numel() * dtypes[0].itemsize]
    offsets = [0]
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        end = offsets[-1] + tensor_nbytes(shape, dtype)
        if i + 1 < len(shapes):
            end = -(-end // PART_ALIGNMENT) * PART_ALIGNMENT
        offsets.append(end)
    return offsets


@dataclass
class MemoryObjMetadata:
    """Shape, dtype, placement and counters of one memory object."""

    shape: torch.Size
    dtype: torch.dtype | None
    address: int
    phy_size: int
    ref_count: int
    pin_count: int = 0
    fmt: MemoryFormat = MemoryFormat.UNDEFINED
    cached_positions: torch.Tensor | None = None
    shapes: list[torch.Size] | None = None
    dtypes: list[torch.dtype] | None = None
    used_size: int | None = field(default=None, repr=False)

    def get_size(self) -> int:
        """Logical size in bytes (what a tier must store)."""
        if self.used_size is not None:
            return self.used_size
        if self.shapes is not None and self.dtypes is not None:
            return part_offsets(self.shapes, self.dtypes)[-1]
        if self.dtype is None:
            return math.prod(self.shape)
        return tensor_nbytes(self.shape, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": dtype_to_str(self.dtype) if self.dtype is not None else None,
            "address": self.address,
            "phy_size": self.phy_size,
            "ref_count": self.ref_count,
            "pin_count": self.pin_count,
            "fmt": self.fmt.value,
            "shapes": [list(s) for s in self.shapes] if self.shapes is not None else None,
            "dtypes": [dtype_to_str(d) for d in self.dtypes] if self.dtypes is not None else None,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> MemoryObjMetadata:
        return MemoryObjMetadata(
            shape=torch.Size(d["shape"]),
            dtype=str_to_dtype(d["dtype"]) if d.get("dtype") is not None else None,
            address=int(d.get("address", 0)),
            phy_size=int(d.get("phy_size", 0)),
            ref_count=int(d.get("ref_count", 1)),
            pin_count=int(d.get("pin_count", 0)),
            fmt=MemoryFormat(d.get("fmt", 0)),
            shapes=[torch.Size(s) for s in d["shapes"]] if d.get("shapes") else None,
            dtypes=[str_to_dtype(x) for x in d["dtypes"]] if d.get("dtypes") else None,
        )


class MemoryObj(abc.ABC):
    """A chunk of bytes with metadata, a reference count and a pin count."""

    __slots__ = ("_l1_manager",)
    _l1_manager: Any

    @abc.abstractmethod
    def invalidate(self) -> None: ...

    @abc.abstractmethod
    def is_valid(self) -> bool: ...

    @abc.abstractmethod
    def get_size(self) -> int:
        """Logical size in bytes."""

    @abc.abstractmethod
    def get_shape(self) -> torch.Size: ...

    @abc.abstractmethod
    def get_dtype(self) -> torch.dtype | None: ...

    @abc.abstractmethod
    def get_shapes(self) -> list[torch.Size]: ...

    @abc.abstractmethod
    def get_dtypes(self) -> list[torch.dtype]: ...

    @abc.abstractmethod
    def get_memory_format(self) -> MemoryFormat: ...

    @abc.abstractmethod
    def get_physical_size(self) -> int:
        """Bytes reserved in the allocator (at least :meth:`get_size`)."""

    @abc.abstractmethod
    def set_used_size(self, used_size: int) -> None: ...

    @abc.abstractmethod
    def pin(self) -> bool: ...

    @abc.abstractmethod
    def unpin(self) -> bool: ...

    @abc.abstractmethod
    def ref_count_up(self) -> None: ...

    @abc.abstractmethod
    def ref_count_down(self) -> None: ...

    @abc.abstractmethod
    def get_ref_count(self) -> int: ...

    @abc.abstractmethod
    def get_num_tokens(self) -> int: ...

    @abc.abstractmethod
    def get_tensor(self, index: int) -> torch.Tensor | None: ...

    @abc.abstractmethod
    def parent(self) -> MemoryAllocatorInterface | None: ...

    @property
    @abc.abstractmethod
    def metadata(self) -> MemoryObjMetadata: ...

    @property
    @abc.abstractmethod
    def tensor(self) -> torch.Tensor | None: ...

    @property
    @abc.abstractmethod
    def byte_array(self) -> memoryview: ...

    @property
    @abc.abstractmethod
    def data_ptr(self) -> int: ...

    @property
    @abc.abstractmethod
    def is_pinned(self) -> bool: ...

    @property
    @abc.abstractmethod
    def can_evict(self) -> bool: ...

    @property
    @abc.abstractmethod
    def raw_tensor(self) -> torch.Tensor | None: ...

    @property
    def shm_offset(self) -> int | None:
        """Byte offset inside the allocator's shared-memory segment, or None."""
        return None

    @property
    def shm_byte_length(self) -> int:
        return self.get_physical_size()

    # The MP server's L1 manager tags objects it owns; the storage tiers never look at it.
    def set_l1_manager(self, manager: Any) -> None:
        self._l1_manager = manager

    def get_l1_manager(self) -> Any:
        return getattr(self, "_l1_manager", None)

    def reset_l1_manager(self) -> None:
        self._l1_manager = None


class _Counted(MemoryObj):
    """Reference/pin counting shared by the concrete objects."""

    __slots__ = ("_lock", "_meta", "_valid")
    _meta: MemoryObjMetadata
    _lock: threading.Lock
    _valid: bool

    def _release(self) -> None:
        """Called once when the reference count reaches zero."""

    def ref_count_up(self) -> None:
        with self._lock:
            self._meta.ref_count += 1

    def ref_count_down(self) -> None:
        with self._lock:
            if self._meta.ref_count <= 0:
                logger.error("ref_count_down on an object that has no reference left")
                return
            self._meta.ref_count -= 1
            released = self._meta.ref_count == 0
        if released:
            self._release()

    def get_ref_count(self) -> int:
        return self._meta.ref_count

    def pin(self) -> bool:
        with self._lock:
            self._meta.pin_count += 1
        return True

    def unpin(self) -> bool:
        with self._lock:
            if self._meta.pin_count <= 0:
                return False
            self._meta.pin_count -= 1
        return True

    @property
    def is_pinned(self) -> bool:
        return self._meta.pin_count > 0

    @property
    def can_evict(self) -> bool:
        return self._meta.pin_count == 0 and self._meta.ref_count <= 1

    def invalidate(self) -> None:
        self._valid = False

    def is_valid(self) -> bool:
        return self._valid

    def set_used_size(self, used_size: int) -> None:
        if used_size < 0 or used_size > self.get_physical_size():
            raise ValueError(f"used size {used_size} outside [0, {self.get_physical_size()}]")
        self._meta.used_size = used_size

    def get_size(self) -> int:
        return self._meta.get_size()

    def get_shape(self) -> torch.Size:
        return self._meta.shape

    def get_dtype(self) -> torch.dtype | None:
        return self._meta.dtype

    def get_shapes(self) -> list[torch.Size]:
        return list(self._meta.shapes) if self._meta.shapes else [self._meta.shape]

    def get_dtypes(self) -> list[torch.dtype]:
        if self._meta.dtypes:
            return list(self._meta.dtypes)
        return [self._meta.dtype] if self._meta.dtype is not None else [torch.uint8]

    def get_memory_format(self) -> MemoryFormat:
        return self._meta.fmt

    def get_physical_size(self) -> int:
        return self._meta.phy_size

    def get_num_tokens(self) -> int:
        shape = self._meta.shape
        dim = self._meta.fmt.token_dim()
        return int(shape[dim]) if len(shape) > dim else 0

    @property
    def metadata(self) -> MemoryObjMetadata:
        return self._meta


class TensorMemoryObj(_Counted):
    """A memory object viewing a byte range of an allocator's buffer (or its own tensor)."""

    __slots__ = ("_allocator", "_raw")

    def __init__(
        self,
        raw_data: torch.Tensor | None,
        metadata: MemoryObjMetadata,
        parent_allocator: MemoryAllocatorInterface | None = None,
    ) -> None:
        if raw_data is None and not isinstance(parent_allocator, HostMemoryAllocator):
            raise ValueError("raw_data is required without a host allocator to slice it from")
        self._raw = raw_data
        self._meta = metadata
        self._allocator = parent_allocator
        self._valid = True
        self._l1_manager = None
        # Allocator-owned objects share the allocator's counter lock: one lock per object
        # would cost more than the contention it avoids.
        self._lock = (
            parent_allocator.counter_lock
            if isinstance(parent_allocator, HostMemoryAllocator)
            else threading.Lock()
        )

    @staticmethod
    def from_tensor(
        tensor: torch.Tensor, fmt: MemoryFormat = MemoryFormat.UNDEFINED
    ) -> TensorMemoryObj:
        """A standalone object (no allocator) holding a copy of ``tensor``."""
        src = tensor.detach().to("cpu").contiguous()
        raw = src.reshape(-1).view(torch.uint8).clone()
        meta = MemoryObjMetadata(
            shape=src.shape, dtype=src.dtype, address=0, phy_size=raw.numel(), ref_count=1, fmt=fmt
        )
        return TensorMemoryObj(raw, meta)

    def _release(self) -> None:
        self._valid = False
        if self._allocator is not None:
            self._allocator.free(self)

    @property
    def raw_tensor(self) -> torch.Tensor:
        if self._raw is None:
            assert isinstance(self._allocator, HostMemoryAllocator)
            start = self._meta.address
            self._raw = self._allocator.buffer[start : start + self._meta.phy_size]
        return self._raw

    def get_tensor(self, index: int) -> torch.Tensor | None:
        shapes, dtypes = self.get_shapes(), self.get_dtypes()
        if not 0 <= index < len(shapes):
            return None
        offset = part_offsets(shapes, dtypes)[index]
        nbytes = tensor_nbytes(shapes[index], dtypes[index])
        raw = self.raw_tensor[offset : offset + nbytes]
        return raw.view(dtypes[index]).view(shapes[index])

    @property
    def tensor(self) -> torch.Tensor | None:
        if not self._valid:
            return None
        return self.get_tensor(0)

    @property
    def byte_array(self) -> memoryview:
        array: Any = self.raw_tensor[: self.get_size()].numpy()
        return memoryview(array).cast("B")

    @property
    def data_ptr(self) -> int:
        return int(self.raw_tensor.data_ptr())

    def parent(self) -> MemoryAllocatorInterface | None:
        return self._allocator

    @property
    def shm_offset(self) -> int | None:
        if isinstance(self._allocator, HostMemoryAllocator) and self._allocator.shm_name:
            return self._meta.address
        return None


class BytesBufferMemoryObj(_Counted):
    """A ``BINARY_BUFFER`` object over its own ``bytearray`` (no allocator)."""

    __slots__ = ("_buf",)

    def __init__(
        self, raw_bytes: bytes | bytearray, metadata: MemoryObjMetadata | None = None
    ) -> None:
        self._buf = bytearray(raw_bytes)
        self._meta = metadata or MemoryObjMetadata(
            shape=torch.Size([len(self._buf)]),
            dtype=torch.uint8,
            address=0,
            phy_size=len(self._buf),
            ref_count=1,
            fmt=MemoryFormat.BINARY_BUFFER,
        )
        self._lock = threading.Lock()
        self._valid = True
        self._l1_manager = None

    @property
    def raw_tensor(self) -> torch.Tensor | None:
        if not self._buf:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(self._buf, dtype=torch.uint8)

    def get_tensor(self, index: int) -> torch.Tensor | None:
        return self.raw_tensor if index == 0 else None

    @property
    def tensor(self) -> torch.Tensor | None:
        return self.raw_tensor

    @property
    def byte_array(self) -> memoryview:
        return memoryview(self._buf)[: self.get_size()]

    @property
    def data_ptr(self) -> int:
        t = self.raw_tensor
        return int(t.data_ptr()) if t is not None else 0

    def parent(self) -> MemoryAllocatorInterface | None:
        return None


@dataclass
class FreeBlock:
    """A free byte range ``[start, start + size)``."""

    start: int
    size: int

    def can_be_coalesced(self, succ: FreeBlock) -> bool:
        return self.start + self.size == succ.start


class MemoryAllocatorInterface(abc.ABC):
    """Hands out :class:`MemoryObj` instances; takes them back in :meth:`free`."""

    @abc.abstractmethod
    def allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> MemoryObj | None:
        """A new object with ``ref_count == 1``, or None when there is no room."""

    def batched_allocate(
        self,
        shapes: ShapesArg,
        dtypes: DtypesArg,
        batch_size: int,
        fmt: MemoryFormat = MemoryFormat.KV_2LTD,
        allocator_type: str | None = None,
    ) -> list[MemoryObj] | None:
        """``batch_size`` objects of the same shape, all or nothing."""
        objs: list[MemoryObj] = []
        for _ in range(batch_size):
            obj = self.allocate(shapes, dtypes, fmt, allocator_type)
            if obj is None:
                self.batched_free(objs)
                return None
            objs.append(obj)
        return objs

    @abc.abstractmethod
    def free(self, memory_obj: MemoryObj, allocator_type: str | None = None) -> None: ...

    def batched_free(
        self,
        memory_objs: Sequence[MemoryObj],
        allocator_type: str | None = None,
        update_stats: bool = True,
    ) -> None:
        for obj in memory_objs:
            self.free(obj, allocator_type)

    @property
    @abc.abstractmethod
    def capacity_bytes(self) -> int: ...

    @property
    @abc.abstractmethod
    def used_bytes(self) -> int: ...

    def wait_for_free(self, timeout: float) -> bool:
        """Block until something is freed or ``timeout`` seconds pass; True if woken."""
        threading.Event().wait(timeout)
        return False

    def memcheck(self) -> bool:
        """Internal consistency check (tests and debugging)."""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        pass


def _lowbit(x: int) -> int:
    return x & -x


def _floor_pow2(x: int) -> int:
    return 1 << (x.bit_length() - 1)


def _aligned_pieces(start: int, length: int) -> list[tuple[int, int]]:
    """Split ``[start, start + length)`` into power-of-two blocks aligned to their size."""
    pieces = []
    pos, end = start, start + length
    while pos < end:
        size = _floor_pow2(end - pos)
        if pos:
            size = min(size, _lowbit(pos))
        pieces.append((pos, size))
        pos += size
    return pieces


SHM_DIR = "/dev/shm"


def attach_shared_buffer(shm_name: str, size: int) -> torch.Tensor:
    """Map an allocator's shared-memory segment in another process (e.g. a worker).

    Objects are then ``buffer[obj.shm_offset : obj.shm_offset + obj.shm_byte_length]``.
    The segment is a POSIX shm object, so ``multiprocessing.shared_memory.SharedMemory(
    shm_name)`` opens it too.
    """
    path = os.path.join(SHM_DIR, shm_name)
    return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)


class HostMemoryAllocator(MemoryAllocatorInterface):
    """Buddy allocator over one preallocated host buffer, optionally POSIX shared memory.

    Why buddy and not slabs: slabs need the chunk size up front and strand memory when
    the mix of sizes changes (full chunks, partial last chunks, MLA vs. KV layouts, layer
    keys), while buddy bookkeeping needs no size hint and coalesces every freed block with
    its free buddy in O(log n), so freed neighbours always merge back into large blocks.
    Two departures from textbook buddy keep it from wasting memory:
      * no rounding to a power of two: an object occupies exactly its size rounded to
        ``min_block_size``; it is freed as aligned power-of-two pieces, which the buddy
        merge then coalesces with whatever is free around them;
      * placement is first fit by address over runs of adjacent free blocks, so objects
        of one size pack back to back instead of each claiming an aligned 2^k block.
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
    ) -> None:
        if min_block_size <= 0 or min_block_size & (min_block_size - 1):
            raise ValueError(f"min_block_size must be a power of two, got {min_block_size}")
        if size < min_block_size:
            raise ValueError(f"allocator size {size} smaller than one block ({min_block_size})")
        self._unit = min_block_size
        self._total_units = size // min_block_size
        self._size = self._total_units * min_block_size
        self._max_order = self._total_units.bit_length() - 1
        # Free blocks: start unit -> order, plus the starts in address order for first fit.
        self._free_order: dict[int, int] = {}
        self._free_starts: list[int] = []
        self._allocated: dict[int, int] = {}  # start unit -> length in units
        self._used_units = 0
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self.counter_lock = threading.Lock()
        self.shm_name: str | None = None
        self._shm_path: str | None = None
        self.buffer = self._make_buffer(use_shm or shm_name is not None, shm_name, pin_memory)
        for start, length in _aligned_pieces(0, self._total_units):
            self._insert_free(start, length.bit_length() - 1)

    def _make_buffer(self, use_shm: bool, shm_name: str | None, pin_memory: bool) -> torch.Tensor:
        if not use_shm:
            buf = torch.empty(self._size, dtype=torch.uint8)
            if pin_memory and torch.cuda.is_available():
                buf = buf.pin_memory()
            elif pin_memory:
                logger.debug("pin_memory requested without an accelerator; using pageable memory")
            return buf
        name = shm_name or f"lmcache_{os.getpid()}_{uuid.uuid4().hex[:12]}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, self._size)
        finally:
            os.close(fd)
        self.shm_name, self._shm_path = name, path
        # torch maps the file itself (MAP_SHARED); no Python buffer export pins the
        # mapping, so close() can unlink while views are still alive.
        return torch.from_file(path, shared=True, size=self._size, dtype=torch.uint8)

    @staticmethod
    def from_config(config: Any, shm_name: str | None = None) -> HostMemoryAllocator:
        """Allocator of ``config.max_local_cpu_size`` GB (shared memory when named)."""
        size = int(config.max_local_cpu_size * 1024**3)
        extra = getattr(config, "extra_config", None) or {}
        shm = shm_name or extra.get("local_cpu.shm_name")
        return HostMemoryAllocator(
            size,
            use_shm=bool(shm) or bool(extra.get("local_cpu.use_shm", False)),
            shm_name=shm or None,
            pin_memory=bool(extra.get("local_cpu.pin_memory", False)),
        )

    # -- buddy core (caller holds self._lock) ----------------------------------------------

    def _take(self, units: int) -> int | None:
        """First fit by address over runs of adjacent free blocks.

        Taking the lowest run that fits, rather than the smallest aligned block of the
        rounded-up order, packs same-sized chunks back to back: with plain buddy placement
        every 192 KiB object would sit at a 256 KiB boundary and strand the gaps.
        """
        starts, orders = self._free_starts, self._free_order
        run_start, run_end, first = -1, -1, 0
        for i, start in enumerate(starts):
            if start != run_end:
                run_start, first = start, i
            run_end = start + (1 << orders[start])
            if run_end - run_start >= units:
                break
        else:
            return None
        for start in starts[first : i + 1]:
            del orders[start]
        del starts[first : i + 1]
        end = run_start + units
        for piece_start, piece_len in _aligned_pieces(end, run_end - end):
            self._give(piece_start, piece_len.bit_length() - 1)
        return run_start

    def _insert_free(self, start: int, order: int) -> None:
        self._free_order[start] = order
        bisect.insort(self._free_starts, start)

    def _remove_free(self, start: int) -> None:
        del self._free_order[start]
        del self._free_starts[bisect.bisect_left(self._free_starts, start)]

    def _give(self, start: int, order: int) -> None:
        while order < self._max_order:
            buddy = start ^ (1 << order)
            if self._free_order.get(buddy) != order:
                break
            self._remove_free(buddy)
            start = min(start, buddy)
            order += 1
        self._insert_free(start, order)

    # -- public API -------------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        return self._size

    @property
    def used_bytes(self) -> int:
        return self._used_units * self._unit

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
        with self._lock:
            start = self._take(units)
            if start is None:
                return None
            self._allocated[start] = units
            self._used_units += units
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
            self._used_units -= units
            for piece_start, piece_len in _aligned_pieces(start, units):
                self._give(piece_start, piece_len.bit_length() - 1)
            self._freed.notify_all()
        memory_obj.invalidate()

    def wait_for_free(self, timeout: float) -> bool:
        with self._freed:
            return self._freed.wait(timeout)

    def largest_free_block(self) -> int:
        with self._lock:
            return max(((1 << o) * self._unit for o in self._free_order.values()), default=0)

    def memcheck(self) -> bool:
        """Free blocks and live objects tile the buffer exactly, with no buddy left unmerged."""
        with self._lock:
            if sorted(self._free_order) != self._free_starts:
                return False
            spans = list(self._allocated.items())
            for s, order in self._free_order.items():
                if s % (1 << order):
                    return False
                if order < self._max_order and self._free_order.get(s ^ (1 << order)) == order:
                    return False
                spans.append((s, 1 << order))
            spans.sort()
            pos = 0
            for s, n in spans:
                if s != pos:
                    return False
                pos += n
            return pos == self._total_units

    def close(self) -> None:
        if self._allocated:
            logger.warning("closing allocator with %d live objects", len(self._allocated))
        if self._shm_path is not None:
            try:
                os.unlink(self._shm_path)
            except FileNotFoundError:
                pass
            self._shm_path = None

    def __enter__(self) -> HostMemoryAllocator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
