"""Upstream's path of :class:`MPTransferMode`; it lives in :mod:`lmcache.v1.platform.transfer_mode`
(device specs choose their default mode, and the platform layer must not import this one)."""

from __future__ import annotations

from lmcache.v1.platform.transfer_mode import (
    ENV_MP_TRANSFER_MODE,
    MPTransferMode,
    resolve_transfer_mode,
)

__all__ = ["ENV_MP_TRANSFER_MODE", "MPTransferMode", "resolve_transfer_mode"]
