"""Upstream LMCache 0.5.6's ``lmcache.v1.multiprocess.http_apis``: the MP server's HTTP
routes as one module per group, each exposing a FastAPI ``router``; every ``*_api`` module
here is mounted by :class:`upstream_056.http_api_registry.HTTPAPIRegistry`.

The routes find the cache server on ``request.app.state.engine`` (an
:class:`~lmcache.v1.multiprocess.server.handler.MPCacheServer`) and answer 503 until it is
set.  Provided groups:

* :mod:`.info_api`: ``/``, ``/healthcheck``, ``/status``, the version routes;
* :mod:`.cache_api`: ``POST /cache/clear``; it also holds the block checksum computation of
  upstream's ``/cache/checksums`` (:mod:`.block_checksums`) without the route: our server
  does not hold the engine's KV tensors;
* :mod:`.config_api`: ``GET /config`` (the server's configuration, secrets redacted) and
  ``GET /config/adapters`` (its L2 tiers);
* :mod:`.common_api`: the operator routes of :mod:`lmcache.v1.multiprocess.server.operator_routes`
  (``/env``, ``/loglevel``, ``/threads``, ``/periodic-threads``, ``/metrics``,
  ``/run_script``).

:mod:`.dependencies` is upstream's per-app context (``build_context`` / ``get_context``).
Upstream's object listing, prefetch and reconfiguration groups are not provided.
``lmcache server`` itself serves :func:`lmcache.v1.multiprocess.server.http_frontend.build_app`,
which serves its own variants of the info and cache routes plus ``/metrics``, and the
operator routes but ``/metrics``.
"""
