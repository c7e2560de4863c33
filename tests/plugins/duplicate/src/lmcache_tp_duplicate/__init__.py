"""Registry test plugin: duplicate."""

from lmcache_tp_base import TestSpec as _TestSpec


class DuplicateCpuSpec(_TestSpec):
    """Claims the in-tree backend's name; must be ignored."""

    _device_type = "cpu"
    _backend_name = "cpu"
