"""Upstream LMCache 0.5.6's ``lmcache.v1.internal_api_server`` package path.

Only its engine-independent ``common`` route group exists here, and it is product code:
``lmcache server``'s operator routes, :mod:`lmcache.v1.multiprocess.server.operator_routes`
(a row of :mod:`lmcache.compat.paths`).  Upstream's ``/periodic-threads`` routes live in
:mod:`upstream_056.http_apis.periodic_thread_api`.
"""
