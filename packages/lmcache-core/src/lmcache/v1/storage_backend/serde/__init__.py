"""L2 serde: what an L2 tier stores, compressed (``fp8``, ``asym_k16_v8``) and/or
encrypted (``aesgcm``), configured per tier as ``"serde": {...}`` in ``--l2-adapter``.

* :mod:`.base`: stages, :class:`SerdeConfig`, :class:`SerdeError`, upstream's interfaces;
* :mod:`.fp8`, :mod:`.asym_k16_v8`, :mod:`.aesgcm` (+ :mod:`.key_provider`): the serdes;
* :mod:`.factory`: types by name, the ``"serde"`` object parsed and built;
* :mod:`.chunk_serde`: a serde applied to whole chunks (the stored, self-describing form);
* :mod:`.backend`: :class:`SerdeBackend`, any tier wrapped with a serde;
  :func:`wrap_with_serde` is the one call a tier builder makes.
"""

from __future__ import annotations

from lmcache.v1.storage_backend.abstract_backend import (
    AllocatorBackendInterface,
    StorageBackendInterface,
)
from lmcache.v1.storage_backend.serde.backend import SerdeBackend
from lmcache.v1.storage_backend.serde.base import SerdeConfig, SerdeError
from lmcache.v1.storage_backend.serde.chunk_serde import ChunkSerde
from lmcache.v1.storage_backend.serde.factory import (
    build_chunk_serde,
    get_registered_serde_types,
    parse_serde_config,
    serde_workers,
)


def wrap_with_serde(
    inner: StorageBackendInterface,
    config: SerdeConfig | None,
    local_cpu_backend: AllocatorBackendInterface | None = None,
) -> StorageBackendInterface:
    """``inner`` itself without a serde, else ``inner`` wrapped with it."""
    if config is None:
        return inner
    return SerdeBackend(inner, build_chunk_serde(config), local_cpu_backend, serde_workers(config))


__all__ = [
    "ChunkSerde",
    "SerdeBackend",
    "SerdeConfig",
    "SerdeError",
    "build_chunk_serde",
    "get_registered_serde_types",
    "parse_serde_config",
    "serde_workers",
    "wrap_with_serde",
]
