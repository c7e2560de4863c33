"""The KV layout seen from the server: :class:`KVLayout` (now in the platform layer) plus
the ``MemoryFormat`` its chunk objects are stored in."""

from __future__ import annotations

from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.platform.kv_layout import KVLayout, dtype_from_name, dtype_name

__all__ = ["KVLayout", "chunk_memory_format", "dtype_from_name", "dtype_name"]


def chunk_memory_format(layout: KVLayout) -> MemoryFormat:
    """The format of a stored chunk object of ``layout`` (``KV_MLA_FMT`` or ``KV_2LTD``)."""
    return MemoryFormat.KV_MLA_FMT if layout.use_mla else MemoryFormat.KV_2LTD
