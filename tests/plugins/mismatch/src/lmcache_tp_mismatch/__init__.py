"""Registry test plugin: mismatch."""

from lmcache_tp_base import TestSpec as _TestSpec


class MismatchSpec(_TestSpec):
    _backend_name = "actualname"
