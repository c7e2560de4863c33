"""What the registry holds: where each backend came from, what was skipped, what was chosen.

Plain frozen records plus the variable names the selection rules read; no discovery, no
selection logic, no torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from lmcache.v1.platform.base.device_spec import DeviceSpec

DEVICE_PLUGIN_ENTRY_POINT_GROUP = "lmcache.device_plugins"
DEVICE_BACKEND_ENV_VAR = "LMCACHE_DEVICE_BACKEND"
DEVICE_TYPE_ENV_VAR = "DEVICE_TYPE"
PLUGINS_AUTOLOAD_ENV_VAR = "LMCACHE_DEVICE_PLUGINS_AUTOLOAD"
CPU_DEVICE_TYPE = "cpu"


@dataclasses.dataclass(frozen=True)
class BackendSource:
    """Where a backend came from, for logs and ``lmcache devices``."""

    kind: str  # "in-tree" or "entry-point"
    module: str
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None

    def describe(self) -> str:
        if self.kind == "in-tree":
            return f"in-tree ({self.module})"
        dist = f"{self.distribution} {self.version}" if self.distribution else "unknown dist"
        return f"{dist} (entry point {self.entry_point})"


@dataclasses.dataclass(frozen=True)
class RegisteredBackend:
    spec: DeviceSpec
    source: BackendSource

    @property
    def backend_name(self) -> str:
        return self.spec.backend_name

    @property
    def device_type(self) -> str:
        return self.spec.device_type


@dataclasses.dataclass(frozen=True)
class SkippedPlugin:
    """A discovered backend that was not registered, and why."""

    name: str
    target: str
    source: str
    reason: str


@dataclasses.dataclass(frozen=True)
class DeviceRegistry:
    backends: Mapping[str, RegisteredBackend]
    skipped: tuple[SkippedPlugin, ...]

    def by_device_type(self) -> dict[str, list[RegisteredBackend]]:
        groups: dict[str, list[RegisteredBackend]] = {}
        for backend in self.backends.values():
            groups.setdefault(backend.device_type, []).append(backend)
        return groups


@dataclasses.dataclass(frozen=True)
class BackendSelection:
    backend: RegisteredBackend
    reason: str

    @property
    def spec(self) -> DeviceSpec:
        return self.backend.spec

    @property
    def device_type(self) -> str:
        return self.backend.device_type
