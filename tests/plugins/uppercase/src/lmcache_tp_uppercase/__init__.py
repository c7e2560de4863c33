"""Registry test plugin: uppercase."""

from lmcache_tp_base import TestSpec as _TestSpec


class UpperSpec(_TestSpec):
    _backend_name = "UpperCase"
