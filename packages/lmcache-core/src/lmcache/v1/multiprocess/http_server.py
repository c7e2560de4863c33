"""Old home of the HTTP frontend: it now lives in
:mod:`lmcache.v1.multiprocess.server.http_frontend` (part of the server package)."""

from lmcache.v1.multiprocess.server.http_frontend import (
    HTTPFrontend,
    PrometheusEndpoint,
    build_app,
)

__all__ = ["HTTPFrontend", "PrometheusEndpoint", "build_app"]
