"""Upstream LMCache 0.5.6's ``lmcache.v1.gpu_connector`` path, for code written against it.

lmcache-core provides only the format-geometry part of that package:

* :mod:`upstream_056.gpu_connector.kv_format` -- one ``KVFormatSpec`` class per
  ``EngineKVFormat`` (static layout facts plus geometry getters over a ``kv_caches``),
  built from the format table in :mod:`lmcache.v1.platform.kv_formats`;
* :mod:`upstream_056.gpu_connector.utils` -- ``LayoutHints`` and the ``get_*`` geometry
  facade over those specs.

Upstream's in-process GPU connectors (``gpu_connectors``, ``gpu_ops``, the XPU/HPU/MUSA
connectors and GDS contexts) are not provided: lmcache-core moves KV through the
device backends of :mod:`lmcache.v1.platform` instead.
"""
