"""Upstream LMCache 0.5.6's internal API, implemented over lmcache-core's product code.

What lives here exists only so that code and tests written against upstream 0.5.6's
internal modules import and run unchanged: its allocators, gpu_connector helpers, native
helpers in Python, MP-server side modules (futures, sessions, token hasher, CacheBlend
planning), its HTTP route registry, and the server settings (coordinator, P2P, server
modules) that ``lmcache server`` accepts and reports as ignored.

The rules:

* product code never imports this package; it depends on product code, never the reverse;
* each upstream import path that resolves here is one row of :mod:`lmcache.compat.paths`
  (upstream name -> home), so there is one greppable list and no stub files;
* a feature users configure (eviction policies, quotas, serde, L2 adapters) is product code
  in a product folder, reachable under upstream's name through that table; only what has
  no use outside upstream's API lives here.
"""
