"""``CpuNativeDeviceOps``: the torch baseline with the native host kernels bound over it."""

from __future__ import annotations

import functools
import importlib
import logging
import os
from types import ModuleType
from typing import ClassVar

from lmcache.v1.platform.base.device_ops import DeviceOps

logger = logging.getLogger(__name__)

NATIVE_OPS_MODULE = "lmcache_cpu.native_ops"
DISABLE_NATIVE_ENV_VAR = "LMCACHE_CPU_DISABLE_NATIVE"


def _native_disabled() -> bool:
    return os.environ.get(DISABLE_NATIVE_ENV_VAR, "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
    )


@functools.cache
def load_native_ops() -> ModuleType | None:
    """The native ops module, or None (after one warning per process) when it is unusable.

    Cached so that the warning is logged once, however many ops objects are created; the
    import system caches the module anyway.
    """
    if _native_disabled():
        logger.warning(
            "%s is set: CpuNativeDeviceOps stays on the torch baseline for all ops.",
            DISABLE_NATIVE_ENV_VAR,
        )
        return None
    try:
        return importlib.import_module(NATIVE_OPS_MODULE)
    except ImportError as exc:  # missing extension, ABI mismatch, unsupported CPU
        logger.warning(
            "lmcache_cpu native extension unavailable (%s: %s); CpuNativeDeviceOps stays on "
            "the torch baseline for all ops.",
            type(exc).__name__,
            exc,
        )
        return None


class CpuNativeDeviceOps(DeviceOps):
    """Host ops: native kernels where ``lmcache_cpu.native_ops`` has them, else torch."""

    device_type: ClassVar[str] = "cpu"

    def ensure_native(self) -> None:
        if self._native_bound:
            return
        module = load_native_ops()
        if module is not None:
            self.bind_native(module)
