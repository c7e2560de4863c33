"""Exceptions of the native ops (importable without loading the extension)."""

from __future__ import annotations

# One class for the baseline and every native backend, so callers catch one thing.
from lmcache.v1.platform.ops_types import KVIndexError

__all__ = ["KVIndexError"]
