"""Load a plugin's native ops module fail-soft: one warning, then the torch baseline.

Every native backend follows the same rules: a disable variable (any value but empty,
``0``, ``false`` or ``no``) keeps the baseline; a module that cannot be imported (missing
extension, ABI mismatch, unsupported CPU) or whose optional ``probe`` finds the hardware
unusable keeps the baseline too. Each case logs exactly one warning per process, on the
plugin's own logger, however many ops objects are created.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import ClassVar

from lmcache.v1.platform.base.device_ops import DeviceOps

__all__ = ["NativeDeviceOps", "NativeModuleLoader", "env_flag_set"]

_FALSE_VALUES = ("", "0", "false", "no")


def env_flag_set(name: str) -> bool:
    """True when environment variable ``name`` holds anything but empty/0/false/no."""
    return os.environ.get(name, "").strip().lower() not in _FALSE_VALUES


class NativeModuleLoader:
    """Imports ``module`` once per process, or returns None after one warning.

    ``probe`` runs after a successful import and returns why the kernels cannot run here
    ('' when they can); an exception it raises counts as a failed probe.
    """

    def __init__(
        self,
        module: str,
        *,
        disable_env_var: str,
        ops_name: str,
        label: str,
        logger: logging.Logger,
        probe: Callable[[], str] | None = None,
    ) -> None:
        self.module = module
        self.disable_env_var = disable_env_var
        self.ops_name = ops_name
        self.label = label
        self.logger = logger
        self.probe = probe
        self._lock = threading.Lock()
        self._loaded = False
        self._result: ModuleType | None = None

    @property
    def baseline_note(self) -> str:
        return f"{self.ops_name} stays on the torch baseline for all ops."

    def __call__(self) -> ModuleType | None:
        with self._lock:
            if not self._loaded:
                self._result = self._load()
                self._loaded = True
            return self._result

    def cache_clear(self) -> None:
        """Forget the outcome (tests), so the next call imports and warns again."""
        with self._lock:
            self._loaded = False
            self._result = None

    def _load(self) -> ModuleType | None:
        note = self.baseline_note
        if env_flag_set(self.disable_env_var):
            self.logger.warning("%s is set: %s", self.disable_env_var, note)
            return None
        try:
            module = importlib.import_module(self.module)
            problem = self.probe() if self.probe is not None else ""
        except ImportError as exc:
            self.logger.warning(
                "%s native extension unavailable (%s: %s); %s",
                self.label,
                type(exc).__name__,
                exc,
                note,
            )
            return None
        except Exception as exc:  # a driver or runtime failure while probing
            self.logger.warning(
                "%s kernels cannot be probed (%s: %s); %s",
                self.label,
                type(exc).__name__,
                exc,
                note,
            )
            return None
        if problem:
            self.logger.warning("%s kernels unusable here: %s; %s", self.label, problem, note)
            return None
        return module


class NativeDeviceOps(DeviceOps):
    """``DeviceOps`` whose ``ensure_native`` binds ``native_loader``'s module, if any."""

    native_loader: ClassVar[NativeModuleLoader | None] = None

    def ensure_native(self) -> None:
        if self._native_bound or self.native_loader is None:
            return
        module = self.native_loader()
        if module is not None:
            self.bind_native(module)
