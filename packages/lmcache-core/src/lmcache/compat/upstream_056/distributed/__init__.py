"""Upstream LMCache 0.5.6's ``lmcache.v1.distributed`` package: its MP storage manager.

lmcache-core keeps one storage stack (:mod:`lmcache.v1.storage_backend`); upstream's names
that code written against its storage manager uses reach that stack through rows of
:mod:`lmcache.compat.paths`:

- ``lmcache.v1.distributed.l2_adapters`` is the product's
  :mod:`lmcache.v1.storage_backend.l2_adapters`;
- ``serde.fp8``, ``serde.aesgcm`` and ``serde.key_provider`` are the product's
  :mod:`lmcache.v1.storage_backend.serde` modules (upstream-only names in :mod:`.serde`);
- ``quota_manager`` is the product's :mod:`lmcache.v1.storage_backend.quota`;
- ``eviction_policy`` is the product's eviction policies behind upstream's
  event-and-action interface (:mod:`.eviction`);
- ``api`` and ``internal_api`` here hold the value types those use.

Upstream's storage manager, controllers and L1 manager are not provided (the server's
:class:`~lmcache.v1.storage_backend.storage_manager.StorageManager` replaces them).
"""
