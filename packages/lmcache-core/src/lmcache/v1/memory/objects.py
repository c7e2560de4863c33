"""The concrete memory objects: reference and pin counting, tensor views, byte buffers.

:class:`TensorMemoryObj` views a byte range of a host allocator's buffer (or owns a
standalone tensor); :class:`BytesBufferMemoryObj` owns a ``bytearray``.  Both count
references and pins the same way (``_Counted``); the protocol is described in
:mod:`lmcache.v1.memory.base`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

from lmcache.v1.memory.base import (
    HostBufferAllocator,
    MemoryAllocatorInterface,
    MemoryObj,
    MemoryObjMetadata,
)
from lmcache.v1.memory.format import MemoryFormat, part_offsets, tensor_nbytes
from lmcache.v1.memory.pin_hooks import PIN_HOOKS

logger = logging.getLogger(__name__)


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
    """A memory object viewing a byte range of an allocator's buffer (or its own tensor).

    Every pin and unpin is reported to the process's pin observers
    (:data:`lmcache.v1.memory.pin_hooks.PIN_HOOKS`).
    """

    __slots__ = ("_allocator", "_raw")

    def __init__(
        self,
        raw_data: torch.Tensor | None,
        metadata: MemoryObjMetadata,
        parent_allocator: MemoryAllocatorInterface | None = None,
    ) -> None:
        if raw_data is None and not isinstance(parent_allocator, HostBufferAllocator):
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
            if isinstance(parent_allocator, HostBufferAllocator)
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

    def pin(self) -> bool:
        # Observers run under the object's lock so a concurrent unpin cannot reach them
        # before this pin does (the lock order is always object lock, then theirs).
        with self._lock:
            self._meta.pin_count += 1
            PIN_HOOKS.pinned(self, self._meta.pin_count)
        return True

    def unpin(self) -> bool:
        with self._lock:
            if self._meta.pin_count <= 0:
                logger.warning("unpin of an unpinned memory object at %d", self._meta.address)
                return False
            self._meta.pin_count -= 1
            PIN_HOOKS.unpinned(self, self._meta.pin_count)
        return True

    @property
    def _used_size_override(self) -> int | None:
        """Upstream's name for the narrowed size set by :meth:`set_used_size` (or None)."""
        return self._meta.used_size

    @property
    def raw_tensor(self) -> torch.Tensor:
        if self._raw is None:
            assert isinstance(self._allocator, HostBufferAllocator)
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
        used = self._meta.used_size
        if used is not None:
            # A narrowed buffer holds fewer bytes than its layout: a flat uint8 view of the
            # used bytes keeps tensor, get_size, byte_array and shm_byte_length in step.
            return self.raw_tensor[:used]
        return self.get_tensor(0)

    @property
    def shm_byte_length(self) -> int:
        return self.get_size()

    @property
    def byte_array(self) -> memoryview:
        # A numpy view exports the bytes without creating a ctypes array type per call
        # (upstream's ctypes version needs _get_cached_ubyte_array_type to not leak them).
        array: Any = self.raw_tensor[: self.get_size()].numpy()
        return memoryview(array).cast("B")

    @property
    def data_ptr(self) -> int:
        return int(self.raw_tensor.data_ptr())

    def parent(self) -> MemoryAllocatorInterface | None:
        return self._allocator

    @property
    def shm_offset(self) -> int | None:
        if isinstance(self._allocator, HostBufferAllocator) and self._allocator.shm_name:
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

    def set_used_size(self, used_size: int) -> None:
        """Checked but kept as is: the buffer's length is its used size (as upstream)."""
        if used_size < 0 or used_size > self.get_physical_size():
            raise ValueError(f"used size {used_size} outside [0, {self.get_physical_size()}]")

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
