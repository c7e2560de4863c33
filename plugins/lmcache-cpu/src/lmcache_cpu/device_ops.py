"""``CpuNativeDeviceOps``: the torch baseline with the native host kernels bound over it."""

from __future__ import annotations

import logging
from typing import ClassVar

from lmcache.v1.platform.kernel_kit.native_loader import NativeDeviceOps, NativeModuleLoader

logger = logging.getLogger(__name__)

NATIVE_OPS_MODULE = "lmcache_cpu.native_ops"
DISABLE_NATIVE_ENV_VAR = "LMCACHE_CPU_DISABLE_NATIVE"

load_native_ops = NativeModuleLoader(
    NATIVE_OPS_MODULE,
    disable_env_var=DISABLE_NATIVE_ENV_VAR,
    ops_name="CpuNativeDeviceOps",
    label="lmcache_cpu",
    logger=logger,
)


class CpuNativeDeviceOps(NativeDeviceOps):
    """Host ops: native kernels where ``lmcache_cpu.native_ops`` has them, else torch."""

    device_type: ClassVar[str] = "cpu"
    native_loader = load_native_ops
