"""How L1 manages its memory: upstream's storage-manager settings, as the server passes them.

``lmcache server`` takes upstream 0.5.6's storage-manager flags (``--eviction-trigger-
watermark``, ``--l1-use-lazy``, ``--l1-align-bytes``, ...); they become one
:class:`L1Settings` that the server hands to the storage layer (storage never imports the
server).  The engine configuration (YAML / ``LMCACHE_*``) has no such keys and builds L1
without it: on-demand eviction only, as before.

What each setting does here is documented field by field below and in docs/storage.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "PREFETCH_POLICIES",
    "STORE_POLICIES",
    "HUGEPAGE_BYTES",
    "L1Settings",
]

STORE_POLICIES = ("default", "skip_l1")
"""``--l2-store-policy``: ``default`` keeps a stored chunk in L1 and writes it through to
every lower tier; ``skip_l1`` deletes it from L1 once a lower tier holds it (L1 is a write
buffer)."""

PREFETCH_POLICIES = ("default", "retain")
"""``--l2-prefetch-policy``: ``default`` drops a chunk the prefetcher read into L1 once the
lookup session that wanted it ends; ``retain`` keeps it in L1 (subject to eviction)."""

HUGEPAGE_BYTES = 2 * 1024 * 1024
"""``--l1-use-hugepages`` maps L1 from the 2 MiB hugepage pool, as upstream."""


@dataclass(frozen=True)
class L1Settings:
    """Upstream's L1 settings with upstream's defaults."""

    eviction_trigger_watermark: float = 0.8
    """Eviction starts when L1's used bytes reach this fraction of its capacity."""
    eviction_ratio: float = 0.2
    """Then this fraction of the used bytes is evicted, in eviction-policy order."""
    read_ttl_seconds: float = 300.0
    """A pin (lookup lock) older than this no longer protects its chunk from eviction."""
    write_ttl_seconds: float = 600.0
    """A reserved but unfinished store is released after this long (the server applies
    it to prepared engine-driven stores)."""
    use_lazy: bool = True
    """Start with ``init_size_gb`` of L1 usable and grow to the full size."""
    init_size_gb: float = 20.0
    """The usable L1 size at start-up with ``use_lazy`` (capped at the full size)."""
    align_bytes: int = 4096
    """Every L1 object starts at a multiple of this (a power of two)."""
    use_hugepages: bool = False
    """Map L1 from the 2 MiB hugepage pool (private memory only: not with shared memory)."""
    notifier_interval_ms: int = 5
    """How often the eviction notifier checks L1's usage against the watermark."""

    def validate(self) -> L1Settings:
        """Raises ``ValueError`` naming the flag of the first bad value."""
        _fraction("--eviction-trigger-watermark", self.eviction_trigger_watermark)
        _fraction("--eviction-ratio", self.eviction_ratio)
        _positive("--l1-read-ttl-seconds", self.read_ttl_seconds)
        _positive("--l1-write-ttl-seconds", self.write_ttl_seconds)
        _positive("--l1-init-size-gb", self.init_size_gb)
        _positive("--periodic-notifier-interval-ms", self.notifier_interval_ms)
        align = self.align_bytes
        if isinstance(align, bool) or not isinstance(align, int) or align <= 0:
            raise ValueError(f"--l1-align-bytes must be a positive integer, got {align!r}")
        if align & (align - 1):
            raise ValueError(f"--l1-align-bytes must be a power of two, got {align}")
        return self

    @property
    def notifier_interval_s(self) -> float:
        return self.notifier_interval_ms / 1000.0

    def init_size_bytes(self, size_bytes: int) -> int:
        """Bytes usable at start-up for an L1 of ``size_bytes``: all of it without lazy
        allocation (or with hugepages, which upstream pre-allocates)."""
        if not self.use_lazy or self.use_hugepages:
            return size_bytes
        return min(size_bytes, int(self.init_size_gb * 1024**3))


def _fraction(flag: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{flag} must be a number in (0, 1], got {value!r}")
    if not math.isfinite(value) or not 0 < value <= 1:
        raise ValueError(f"{flag} must be in (0, 1], got {value}")


def _positive(flag: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{flag} must be a positive number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{flag} must be positive, got {value}")
