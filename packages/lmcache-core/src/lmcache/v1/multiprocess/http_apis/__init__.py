"""Upstream 0.5.6's ``lmcache.v1.multiprocess.http_apis`` package path.

Upstream groups its MP server's FastAPI routers here. lmcache-core serves its HTTP API
from :mod:`lmcache.v1.multiprocess.server.http_frontend`, so only the engine-independent
helpers that upstream's unit tests reach live under this path (see :mod:`.cache_api`);
no router is defined and importing this package pulls in no web framework.
"""
