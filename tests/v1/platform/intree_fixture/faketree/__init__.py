"""An in-tree-style backend package used to exercise the in-tree scan path.

Tests append this folder's parent to ``lmcache.v1.platform.__path__`` in a subprocess, so
the registry sees ``lmcache.v1.platform.faketree`` exactly like a package shipped inside
lmcache.
"""

from __future__ import annotations

from lmcache.v1.platform.base.device_spec import DeviceSpec


class FakeTreeDeviceSpec(DeviceSpec):
    @property
    def device_type(self) -> str:
        return "faketree"

    @property
    def torch_module_name(self) -> str:
        return "cpu"

    def is_available(self) -> bool:
        return True


class ReexportedElsewhere(DeviceSpec):
    """Defined here, so it is registered; re-exports of other modules' specs are not."""

    @property
    def device_type(self) -> str:
        return "faketree2"
