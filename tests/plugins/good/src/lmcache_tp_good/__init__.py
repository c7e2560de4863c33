"""Registry test plugin: good."""

from lmcache_tp_base import TestSpec as _TestSpec


class GoodSpec(_TestSpec):
    """A well-formed external backend."""

    _backend_name = "fakegood"
