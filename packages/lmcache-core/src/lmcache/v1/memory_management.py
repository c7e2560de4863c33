"""Compatibility path: the memory layer now lives in :mod:`lmcache.v1.memory`.

Upstream users, plugins and older code import ``lmcache.v1.memory_management``; every
public name it had is re-exported from its new home:
:mod:`~lmcache.v1.memory.format` (formats and sizes), :mod:`~lmcache.v1.memory.base`
(the object and allocator contracts), :mod:`~lmcache.v1.memory.objects` (concrete
objects), :mod:`~lmcache.v1.memory.allocator` (the host allocator) and
:mod:`~lmcache.v1.memory.shm` (its shared-memory segment).  Upstream's private host-buffer
helpers (``_allocate_cpu_memory`` and three more) are added to this module by the
compatibility layer (``lmcache.compat.paths.UPSTREAM_EXTRAS``); this file never imports it.
"""

from lmcache.v1.memory.allocator import FreeBlock, HostMemoryAllocator
from lmcache.v1.memory.base import MemoryAllocatorInterface, MemoryObj, MemoryObjMetadata
from lmcache.v1.memory.format import (
    PART_ALIGNMENT,
    DtypesArg,
    MemoryFormat,
    ShapesArg,
    normalize_shapes_dtypes,
    part_offsets,
    tensor_nbytes,
)
from lmcache.v1.memory.objects import BytesBufferMemoryObj, TensorMemoryObj
from lmcache.v1.memory.shm import SHM_DIR, attach_shared_buffer

__all__ = [
    "PART_ALIGNMENT",
    "SHM_DIR",
    "BytesBufferMemoryObj",
    "DtypesArg",
    "FreeBlock",
    "HostMemoryAllocator",
    "MemoryAllocatorInterface",
    "MemoryFormat",
    "MemoryObj",
    "MemoryObjMetadata",
    "ShapesArg",
    "TensorMemoryObj",
    "attach_shared_buffer",
    "normalize_shapes_dtypes",
    "part_offsets",
    "tensor_nbytes",
]
