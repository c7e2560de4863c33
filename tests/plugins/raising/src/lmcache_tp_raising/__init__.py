"""Registry test plugin: raising."""

from lmcache_tp_base import TestSpec as _TestSpec


class RaisingSpec(_TestSpec):
    _backend_name = "raising"

    def __init__(self) -> None:
        super().__init__()
        raise RuntimeError("RaisingSpec refuses to be constructed")
