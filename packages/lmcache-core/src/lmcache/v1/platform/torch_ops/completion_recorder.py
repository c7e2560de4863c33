"""Stream-ordered completion records: ``(kind, payload)`` posted when a stream gets there.

The baseline records immediately (no device stream to wait for); drains are atomic.
"""

from __future__ import annotations

from lmcache.v1.platform.torch_ops.event_recorder import _RecordLog

__all__ = ["drain_recorded_completions", "record_completion_on_stream"]

# Per-process queue of completions waiting for the next drain (the stream-callback target).
_completions: _RecordLog[tuple[str, bytes]] = _RecordLog()


def record_completion_on_stream(cuda_stream_ptr: int, kind: str, payload: bytes) -> None:
    """Record ``(kind, payload)``; ``cuda_stream_ptr`` is ignored by the baseline."""
    _completions.append((kind, bytes(payload)))


def drain_recorded_completions() -> list[tuple[str, bytes]]:
    """Every completion since the previous drain, oldest first."""
    return _completions.drain()
