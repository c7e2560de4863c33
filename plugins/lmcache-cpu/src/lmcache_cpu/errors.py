"""Exceptions of the native ops (importable without loading the extension)."""

from __future__ import annotations


class KVIndexError(IndexError, ValueError):
    """A block id or slot outside the engine buffers, raised before any byte is written.

    Also a ``ValueError``: the torch baseline raises ``ValueError`` for the same inputs, and
    callers written against it must keep working.
    """
