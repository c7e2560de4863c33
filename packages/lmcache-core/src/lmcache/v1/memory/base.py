"""The two contracts of the memory layer: :class:`MemoryObj` and the allocator interface.

A :class:`MemoryObj` is a view of bytes that hold one chunk of KV cache (or any binary
payload) together with its metadata, a reference count and a pin count.  A
:class:`MemoryAllocatorInterface` hands memory objects out and takes them back; dropping an
object's last reference gives its bytes back to the allocator it came from.  Both live in
one module because each names the other in its signatures.

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
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lmcache.utils import dtype_to_str, str_to_dtype
from lmcache.v1.memory.format import (
    DtypesArg,
    MemoryFormat,
    ShapesArg,
    part_offsets,
    tensor_nbytes,
)


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
    def meta(self) -> MemoryObjMetadata:
        """Upstream's attribute name for :attr:`metadata`."""
        return self.metadata

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


class HostBufferAllocator(MemoryAllocatorInterface):
    """An allocator whose objects are byte ranges of one host buffer it owns.

    A :class:`~lmcache.v1.memory.objects.TensorMemoryObj` of such an allocator slices its
    bytes from ``buffer`` on first use and shares ``counter_lock``.  Declared here so the
    objects know the host allocator's shape without importing it (it imports them).
    """

    buffer: torch.Tensor
    counter_lock: threading.Lock
    shm_name: str | None
