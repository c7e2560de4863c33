"""What the server reports about its storage tiers: usage, evictions, errors and health.

The storage layer knows nothing of the server (dependencies point inward), so the server
reads the tiers through their public attributes; the bounded tiers count their own
evictions (``evictions``: objects dropped to make room, never removals the server asks for)
and errors (``errors``), and say what is wrong with them: ``health_problems()`` (the tier
cannot serve: the server is unhealthy) and ``health_degraded()`` (the tier is skipped for
now, e.g. an unreachable Redis behind its open circuit breaker: the server still serves,
degraded).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any

from lmcache.v1.storage_backend.storage_manager import L1_NAME, StorageManager

_PROBE_PREFIX = ".lmcache-health-"


class EvictionCounter:
    """A tier's eviction count as the server reports it (the tier counts: ``evictions``)."""

    def __init__(self, tier: Any) -> None:
        self._tier = tier

    @property
    def evictions(self) -> int:
        return int(self._tier.evictions)


def install_eviction_counters(storage: StorageManager) -> dict[str, EvictionCounter]:
    """A counter for every tier that reports evictions, by tier name."""
    return {
        name: EvictionCounter(backend)
        for name, backend in storage.storage_backends.items()
        if isinstance(getattr(backend, "evictions", None), int)
    }


def tier_kind(name: str, backend: Any) -> str:
    if name == L1_NAME:
        return "l1"
    if hasattr(backend, "path") and hasattr(backend, "capacity_bytes"):
        return "disk"
    return "remote"


def describe_tiers(
    storage: StorageManager, counters: dict[str, EvictionCounter]
) -> list[dict[str, Any]]:
    """One dictionary per tier: name, kind (l1/disk/remote), usage, capacity, evictions."""
    tiers = []
    backend: Any
    for name, backend in storage.storage_backends.items():
        kind = tier_kind(name, backend)
        info: dict[str, Any] = {"name": name, "kind": kind, "used_bytes": 0}
        used = getattr(backend, "used_bytes", None)
        if isinstance(used, int):
            info["used_bytes"] = used
        capacity = getattr(backend, "capacity_bytes", None)
        info["capacity_bytes"] = int(capacity) if isinstance(capacity, int) else None
        try:
            info["objects"] = len(backend)
        except TypeError:
            info["objects"] = None
        counter = counters.get(name)
        info["evictions"] = counter.evictions if counter is not None else None
        if kind == "disk":
            info["path"] = backend.path
        if kind == "l1":
            info.update(_l1_memory(backend))
        errors = getattr(backend, "errors", None)
        if isinstance(errors, int):
            info["errors"] = errors
        stats = getattr(backend, "get_stats", None)
        if kind == "remote" and callable(stats):
            remote = stats()
            info["errors"] = int(remote.get("errors", 0))
            info["hits"] = int(remote.get("hits", 0))
            info["misses"] = int(remote.get("misses", 0))
        tiers.append(info)
    return tiers


def _l1_memory(l1: Any) -> dict[str, Any]:
    """What upstream's storage-manager flags change in L1: the part a lazy L1 has grown to
    (``usable_bytes``) and the objects the watermark notifier evicted."""
    info: dict[str, Any] = {}
    usable = getattr(l1.memory_allocator, "usable_bytes", None)
    if isinstance(usable, int):
        info["usable_bytes"] = usable
    watermark = getattr(l1, "watermark_evictions", None)
    if isinstance(watermark, int):
        info["watermark_evictions"] = watermark
    return info


def tier_problems(storage: StorageManager) -> list[str]:
    """Why a tier cannot serve right now (empty when every tier is healthy).

    The disk tier is probed by creating and removing a file in its directory (a removed or
    read-only directory fails), then asked itself (its last writes all failed, or less
    free space than one chunk).  A remote tier that is unreachable is not a problem here
    but a degradation (:func:`tier_degradations`).
    """
    problems = []
    backend: Any
    for name, backend in storage.storage_backends.items():
        kind = tier_kind(name, backend)
        if kind == "l1":
            if getattr(backend, "_closed", False):
                problems.append(f"{name}: closed")
        elif kind == "disk":
            problem = _probe_directory(backend.path)
            own = getattr(backend, "health_problems", None)
            found = [problem] if problem else (own() if callable(own) else [])
            problems += [f"{name}: {p}" for p in found]
    return problems


def tier_degradations(storage: StorageManager) -> list[str]:
    """Tiers the server skips for now while it keeps serving: a remote tier (or cluster
    shard) whose circuit breaker is open.  A restart would not help, so this is reported
    as degraded, not unhealthy."""
    reasons = []
    backend: Any
    for name, backend in storage.storage_backends.items():
        if tier_kind(name, backend) != "remote":
            continue
        own = getattr(backend, "health_degraded", None)
        if callable(own):
            reasons += [f"{name}: {r}" for r in own()]
        elif getattr(backend, "available", True) is False:
            reasons.append(f"{name}: unreachable")
    return reasons


def _probe_directory(path: str) -> str | None:
    probe = os.path.join(path, f"{_PROBE_PREFIX}{uuid.uuid4().hex[:8]}")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError as exc:
        return f"directory {path} is not writable ({exc.strerror or exc})"
    try:
        os.write(fd, b"ok")
    except OSError as exc:
        return f"cannot write to {path} ({exc.strerror or exc})"
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None
