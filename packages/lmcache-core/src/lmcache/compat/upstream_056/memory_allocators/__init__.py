"""Upstream LMCache 0.5.6's ``lmcache.v1.memory_allocators``: allocators over one buffer.

Modules keep upstream's names:
  * ``tensor_memory_allocator`` -- :class:`TensorMemoryAllocator`, variable-size objects
    in a caller's tensor, placed by the memory layer's buddy core
    (:class:`~lmcache.v1.memory.buddy.BuddySpace`);
  * ``paged_tensor_memory_allocator`` -- :class:`PagedTensorMemoryAllocator`, fixed-size
    pages of a caller's tensor;
  * ``host_memory_allocator``, ``pin_memory_allocator``, ``gpu_memory_allocator`` and
    ``mixed_memory_allocator`` -- allocators that make their own buffer (pageable host,
    pinned host, device, pinned host plus byte buffers) and place objects with one of the
    two above (``use_paging``);
  * ``lazy_memory_allocator`` -- :class:`LazyMemoryAllocator`, a host buffer reserved at
    its final size whose usable prefix grows as a background thread page-locks it.

Upstream's ad-hoc, devdax, cuFile/hipFile and paged CPU-GPU allocators are not
provided.  ``lmcache.v1.memory.allocator.HostMemoryAllocator`` (the L1 tier's shared-memory
allocator) is a different class from upstream's ``host_memory_allocator.HostMemoryAllocator``
here; both exist under their own module paths.
"""
