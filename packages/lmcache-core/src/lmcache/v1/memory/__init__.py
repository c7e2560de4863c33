"""The memory layer: formats, memory objects, the host allocator and its shm segment.

Layering: this package builds on :mod:`lmcache.v1.platform` and is used by the storage
tiers and the server; nothing here imports them.  Modules, bottom up:
``format`` (``MemoryFormat`` and byte geometry) -> ``base`` (the ``MemoryObj`` and
allocator contracts) -> ``objects`` (concrete objects) and ``shm`` (the allocator's POSIX
segment) -> ``allocator`` (the buddy host allocator).
"""
