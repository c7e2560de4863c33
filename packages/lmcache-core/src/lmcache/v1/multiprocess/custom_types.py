"""Upstream's path for the wire payload types, which live in
:mod:`lmcache.v1.multiprocess.wire.custom_types`; kept so upstream code imports unchanged."""

from lmcache.v1.multiprocess.wire.custom_types import *  # noqa: F403
from lmcache.v1.multiprocess.wire.custom_types import __all__ as __all__
