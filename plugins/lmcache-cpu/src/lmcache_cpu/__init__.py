"""lmcache-cpu: native host KV-transfer ops for LMCache's ``cpu`` device type.

Importing this package registers nothing and loads no native code: the platform registry
finds :class:`lmcache_cpu.device.CpuNativeDeviceSpec` through the ``lmcache.device_plugins``
entry point, and the C++ module is imported only when the ops object is first created.
"""

from __future__ import annotations

from lmcache_cpu.errors import KVIndexError

__version__ = "0.1.0"
__all__ = ["KVIndexError", "__version__"]
