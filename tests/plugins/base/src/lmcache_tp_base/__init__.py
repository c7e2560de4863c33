"""Base spec shared by the registry test plugins (no entry point of its own)."""

from __future__ import annotations

import os

from lmcache.v1.platform.base.device_spec import DeviceSpec


def _enabled() -> bool:
    # Test plugins only report available when a test asks, so installing them never
    # changes backend selection for the rest of the suite.
    return os.environ.get("LMCACHE_TEST_PLUGINS_AVAILABLE") == "1"


class TestSpec(DeviceSpec):
    """A spec configured by class attributes; subclasses set the names."""

    _device_type = "fakedev"
    _backend_name = ""
    _priority = 0

    @property
    def device_type(self) -> str:
        return self._device_type

    @property
    def backend_name(self) -> str:
        return self._backend_name

    @property
    def torch_module_name(self) -> str:
        return "cpu"

    @property
    def priority(self) -> int:
        return self._priority

    def is_available(self) -> bool:
        return _enabled()
