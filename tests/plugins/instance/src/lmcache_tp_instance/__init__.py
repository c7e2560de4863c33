"""Registry test plugin: instance."""

from lmcache_tp_base import TestSpec as _TestSpec


class _Spec(_TestSpec):
    _backend_name = "instance"


SPEC = _Spec()
