"""Old path of the worker-side request client, now
:mod:`lmcache.v1.multiprocess.worker.client`; kept for existing imports."""

from lmcache.v1.multiprocess.worker.client import (
    DEFAULT_URL,
    MPClient,
    MPClientError,
    ServerBusyError,
    ServerError,
    ServerUnavailableError,
    free_url,
    normalize_url,
)

__all__ = [
    "DEFAULT_URL",
    "MPClient",
    "MPClientError",
    "ServerBusyError",
    "ServerError",
    "ServerUnavailableError",
    "free_url",
    "normalize_url",
]
