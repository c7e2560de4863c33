"""Registry test plugin: twins."""

from lmcache_tp_base import TestSpec as _TestSpec


class TwinA(_TestSpec):
    _device_type = "twindev"
    _backend_name = "twina"


class TwinB(_TestSpec):
    _device_type = "twindev"
    _backend_name = "twinb"


class PrioA(_TestSpec):
    _device_type = "priodev"
    _backend_name = "prioa"
    _priority = 1


class PrioB(_TestSpec):
    _device_type = "priodev"
    _backend_name = "priob"
    _priority = 2
