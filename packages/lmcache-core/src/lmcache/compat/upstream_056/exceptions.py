"""Upstream LMCache 0.5.6's ``lmcache.v1.exceptions``: exceptions shared by v1 modules.

Only :class:`IrrecoverableException` exists upstream; :mod:`upstream_056.periodic_thread`
ends a thread's loop when its task raises one.
"""

from __future__ import annotations

__all__ = ["IrrecoverableException"]


class IrrecoverableException(Exception):
    """An error retrying cannot fix: a periodic task that raises it stops its thread
    (a later ``start()`` may run it again) instead of being retried every interval."""
