"""Upstream LMCache 0.5.6's ``lmcache.v1.distributed`` package: its MP storage manager.

lmcache-core keeps one storage stack (:mod:`lmcache.v1.storage_backend`); upstream's names
that code written against its storage manager uses reach that stack through rows of
:mod:`lmcache.compat.paths`.  Here: ``eviction_policy`` (the product's eviction policies
behind upstream's event-and-action interface, :mod:`.eviction`), ``quota_manager`` (the
product's :mod:`lmcache.v1.storage_backend.quota`), and the value types those use
(``api.ObjectKey``, ``internal_api``).  Upstream's storage manager, controllers and L1
manager are not provided (the server's :class:`~lmcache.v1.storage_backend.storage_manager.
StorageManager` replaces them).
"""
