"""``MPTransferMode``: how KV bytes move between an inference worker and the cache server."""

from __future__ import annotations

import enum
import os

ENV_MP_TRANSFER_MODE = "LMCACHE_MP_TRANSFER_MODE"


class MPTransferMode(str, enum.Enum):
    """``auto`` dispatches by device type; the other two name a concrete path."""

    AUTO = "auto"
    ENGINE_DRIVEN = "engine_driven"
    LMCACHE_DRIVEN = "lmcache_driven"

    @classmethod
    def parse(cls, value: str | MPTransferMode) -> MPTransferMode:
        """Case-insensitive parse; unknown values raise ``ValueError`` listing the valid ones."""
        if isinstance(value, MPTransferMode):
            return value
        normalized = value.strip().lower()
        for member in cls:
            if member.value == normalized:
                return member
        valid = ", ".join(m.value for m in cls)
        raise ValueError(f"unknown MP transfer mode {value!r}; valid values: {valid}")


def resolve_transfer_mode(explicit: str | MPTransferMode | None = None) -> MPTransferMode:
    """The explicit argument, else ``LMCACHE_MP_TRANSFER_MODE``, else AUTO."""
    if explicit is not None and str(getattr(explicit, "value", explicit)).strip():
        return MPTransferMode.parse(explicit)
    env_value = os.environ.get(ENV_MP_TRANSFER_MODE, "").strip()
    if env_value:
        return MPTransferMode.parse(env_value)
    return MPTransferMode.AUTO
