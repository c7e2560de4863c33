"""The MP cache server: transport, handler (split by operation family) and start-up.

* :mod:`.transport` -- the ZMQ ROUTER loop (:class:`MPServer`) and its handler pools;
* :mod:`.handler` -- :class:`MPCacheServer`, composed of :mod:`.workers`,
  :mod:`.lmcache_driven`, :mod:`.engine_driven`, :mod:`.lookup` and :mod:`.admin` over
  the shared state of :mod:`.state`;
* :mod:`.startup` -- :func:`build_cache_server` and the start-up checks;
* :mod:`.run` -- :func:`run_server`, the frontends and :func:`main`.

The names below are re-exported because this package replaced the ``server`` module and
users, the CLI and the docs import them from here; code in core imports their homes.
"""

from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.rate_limited_logs import RateLimitedErrorLog
from lmcache.v1.multiprocess.server.run import main, run_server, start_frontends
from lmcache.v1.multiprocess.server.startup import (
    build_cache_server,
    check_device_selection,
    check_l1_fits,
    parse_l2_adapter,
)
from lmcache.v1.multiprocess.server.state import CacheServerSettings
from lmcache.v1.multiprocess.server.transport import (
    MAX_IN_FLIGHT,
    AffinityThreadPool,
    MPServer,
)

__all__ = [
    "MAX_IN_FLIGHT",
    "AffinityThreadPool",
    "CacheServerSettings",
    "MPCacheServer",
    "MPServer",
    "RateLimitedErrorLog",
    "build_cache_server",
    "check_device_selection",
    "check_l1_fits",
    "main",
    "parse_l2_adapter",
    "run_server",
    "start_frontends",
]
