"""``PinMemoryBackend``: optional host-memory pinning for staging buffers."""

from __future__ import annotations


class PinMemoryBackend:
    """No-op pinning: the default for devices without a host-registration API."""

    def pin_memory(self, ptr: int, size: int, flags: int = 0) -> bool:
        """Page-lock ``size`` bytes at ``ptr`` for fast DMA; False when unsupported."""
        return False

    def unpin_memory(self, ptr: int) -> bool:
        """Undo :meth:`pin_memory`; False when unsupported."""
        return False

    @property
    def is_pin_supported(self) -> bool:
        return False
