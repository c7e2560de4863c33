"""The loading rules every discovered backend passes, and the record of those that did not.

A backend is skipped -- logged with its source and the reason, recorded in
``DeviceRegistry.skipped`` -- when its constructor raises, its ``device_type`` or
``backend_name`` is not a non-empty lowercase string, its entry-point name differs from its
``backend_name``, or an earlier backend already claimed that ``backend_name``.
"""

from __future__ import annotations

import logging

from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.registry.model import (
    BackendSource,
    DeviceRegistry,
    RegisteredBackend,
    SkippedPlugin,
)

logger = logging.getLogger(__name__)


class _RegistryBuilder:
    """Collects specs in discovery order, enforcing the loading rules."""

    def __init__(self) -> None:
        self.backends: dict[str, RegisteredBackend] = {}
        self.skipped: list[SkippedPlugin] = []

    def skip(self, name: str, target: str, source: str, reason: str) -> None:
        logger.warning(
            "Failed to load LMCache device plugin %r (%s) from %s: %s", name, target, source, reason
        )
        self.skipped.append(SkippedPlugin(name, target, source, reason))

    def add(self, spec: DeviceSpec, source: BackendSource, label: str) -> None:
        target = f"{type(spec).__module__}:{type(spec).__qualname__}"
        try:
            _validate_spec_name(spec.device_type, "device_type")
            backend_name = _validate_spec_name(spec.backend_name, "backend_name")
        except Exception as exc:
            self.skip(label, target, source.describe(), f"{type(exc).__name__}: {exc}")
            return
        if source.kind == "entry-point" and label != backend_name:
            self.skip(
                label,
                target,
                source.describe(),
                f"entry-point name must match DeviceSpec.backend_name "
                f"({label!r} != {backend_name!r})",
            )
            return
        existing = self.backends.get(backend_name)
        if existing is not None:
            reason = (
                f"backend_name {backend_name!r} is already registered by "
                f"{existing.source.describe()}"
            )
            logger.warning(
                "Ignoring DeviceSpec %s because backend_name %r is already registered by %s",
                target,
                backend_name,
                existing.source.describe(),
            )
            self.skipped.append(SkippedPlugin(label, target, source.describe(), reason))
            return
        self.backends[backend_name] = RegisteredBackend(spec, source)

    def build(self) -> DeviceRegistry:
        return DeviceRegistry(dict(self.backends), tuple(self.skipped))


def _validate_spec_name(value: object, field: str) -> str:
    if not isinstance(value, str) or not value or value != value.lower() or value != value.strip():
        raise ValueError(f"{field} must be a non-empty lowercase string (got {value!r})")
    return value


def _instantiate(
    builder: _RegistryBuilder, spec_cls: type[DeviceSpec], label: str, source: BackendSource
) -> DeviceSpec | None:
    target = f"{spec_cls.__module__}:{spec_cls.__qualname__}"
    try:
        spec = spec_cls()
    except Exception as exc:
        builder.skip(
            label, target, source.describe(), f"constructor raised {type(exc).__name__}: {exc}"
        )
        return None
    return spec
