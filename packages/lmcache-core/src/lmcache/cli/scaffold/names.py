"""What ``lmcache plugin new`` must not reuse, and the priority it starts a plugin at.

A backend name is taken when this project's backends use it (in-tree or in our plugin
wheels, installed here or not), when an installed backend or ``lmcache.device_plugins``
entry point has it, or when the distribution or import package the scaffold would write
(``lmcache-<name>``, ``lmcache_<name>``) already exists: each of these collides only
after the vendor has built and installed the wheel.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Iterable

from lmcache.distributions import installed_version
from lmcache.v1.platform.diagnose import declared_priority
from lmcache.v1.platform.registry import DEVICE_PLUGIN_ENTRY_POINT_GROUP, get_registry

# This project's backends, whether or not their wheels are installed here.
FIRST_PARTY_BACKENDS = {
    "cpu": "the in-tree backend (lmcache.v1.platform.cpu)",
    "cpu_native": "the backend of our lmcache-cpu plugin",
    "cuda": "a backend of our lmcache-cuda plugin",
    "rocm": "a backend of our lmcache-cuda plugin",
}
FIRST_PARTY_DISTRIBUTIONS = {
    "lmcache": "upstream LMCache's distribution",
    "lmcache-core": "this core's distribution",
    "lmcache-cpu": "our host-memory plugin's distribution",
    "lmcache-cuda": "our CUDA/ROCm plugin's distribution",
}
# Priorities of this project's backends per device type (lmcache plugin new must not
# outrank them by default).
FIRST_PARTY_PRIORITIES = {"cpu": (0, 10), "cuda": (0, 0)}


def distribution_name(name: str) -> str:
    return f"lmcache-{name.replace('_', '-')}"


def _registered(name: str) -> list[str]:
    backend = get_registry().backends.get(name)
    if backend is None or name in FIRST_PARTY_BACKENDS:
        return []
    return [f"the installed backend {name!r} ({backend.source.describe()}) has it"]


def _entry_points(name: str) -> list[str]:
    eps = importlib.metadata.entry_points(group=DEVICE_PLUGIN_ENTRY_POINT_GROUP)
    return [f"the installed entry point {ep.name} = {ep.value} has it" for ep in eps
            if ep.name == name]  # fmt: skip


def name_conflicts(name: str) -> list[str]:
    """Why ``name`` cannot be a new plugin's backend name (empty: it is free)."""
    reasons = []
    if name in FIRST_PARTY_BACKENDS:
        reasons.append(f"{FIRST_PARTY_BACKENDS[name]} is named {name!r}")
    dist = distribution_name(name)
    if dist in FIRST_PARTY_DISTRIBUTIONS:
        reasons.append(f"{dist} is {FIRST_PARTY_DISTRIBUTIONS[dist]}")
    elif (version := installed_version(dist)) is not None:
        reasons.append(f"the distribution {dist} {version} is installed")
    reasons.extend(_registered(name))
    if not reasons:
        reasons.extend(_entry_points(name))
    package = f"lmcache_{name}"
    if importlib.util.find_spec(package) is not None and not reasons:
        reasons.append(f"the module {package} is importable here")
    return reasons


def check_name_is_free(name: str) -> None:
    reasons = name_conflicts(name)
    if reasons:
        raise ValueError(
            f"backend name {name!r} is taken: {'; '.join(reasons)}. Choose another name "
            f"(a second backend for the device type is fine: lmcache plugin new "
            f"acme_{name} --device-type ...)"
        )


def _priorities(device_type: str) -> Iterable[int]:
    yield from FIRST_PARTY_PRIORITIES.get(device_type, ())
    for backend in get_registry().backends.values():
        if backend.device_type == device_type:
            # a broken plugin (None) says nothing about ranks
            priority = declared_priority(backend)
            if priority is not None:
                yield priority


def default_priority(device_type: str) -> int:
    """Below every known backend of ``device_type`` (0 for a new device type): installing
    the plugin never displaces a backend that is there already."""
    known = list(_priorities(device_type))
    return min(known) - 1 if known else 0
