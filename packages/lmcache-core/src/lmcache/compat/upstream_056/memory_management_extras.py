"""Upstream 0.5.6's private host-buffer helpers, as names of ``lmcache.v1.memory_management``.

``memory_management`` is a product path (the seeds and plugins import it) and never
imports compatibility code; upstream's tests also reach these private helpers through it,
so the path finder adds this module's ``__all__`` to it once it has loaded (a row of
:data:`lmcache.compat.paths.UPSTREAM_EXTRAS`).
"""

from __future__ import annotations

from lmcache.compat.upstream_056.host_buffers import allocate_cpu_memory as _allocate_cpu_memory
from lmcache.compat.upstream_056.host_buffers import (
    cached_ubyte_array_type as _get_cached_ubyte_array_type,
)
from lmcache.compat.upstream_056.host_buffers import free_cpu_memory as _free_cpu_memory
from lmcache.compat.upstream_056.host_buffers import read_hugepage_info as _read_hugepage_info

__all__ = [
    "_allocate_cpu_memory",
    "_free_cpu_memory",
    "_get_cached_ubyte_array_type",
    "_read_hugepage_info",
]
