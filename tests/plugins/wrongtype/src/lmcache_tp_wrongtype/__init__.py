"""Registry test plugin: wrongtype."""

from lmcache_tp_base import TestSpec as _TestSpec


class _Spec(_TestSpec):
    _backend_name = "wrongtype"


def make_spec() -> _TestSpec:
    """A factory: the loading rules require the class itself."""
    return _Spec()
