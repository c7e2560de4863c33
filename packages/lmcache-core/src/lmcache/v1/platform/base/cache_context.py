"""``BaseCacheContext``: the server-side view of one worker's registered KV cache.

LMCache-driven mode maps a worker's KV tensors into the server process (through the
device's ``DeviceIPCWrapper``); the cache context owns those mappings, the layout
description the copy kernels need, and any staging buffers.  It also *does* the copies:
the cache server calls :meth:`BaseCacheContext.transfer_blocks` and waits on the event it
returns through the device's own ``EventIPCBackend``, so the server never names a device.
"""

from __future__ import annotations

import abc
import itertools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from lmcache.v1.platform.base.streams import IPCEvent
    from lmcache.v1.platform.kv_layout import KVLayout
    from lmcache.v1.platform.ops_types import PageBufferShapeDesc, TransferDirection


class BaseCacheContext(abc.ABC):
    """A device's cache context; subclasses set ``device_type`` and implement the rest."""

    device_type: ClassVar[str] = ""
    # Upstream's ``layout_hints["kv_layout"]`` values this context reads correctly.  The
    # server refuses any other declared layout rather than mis-slicing blocks; a context
    # that re-views HND tensors (see ``kv_layout.as_nhd_view``) adds ``"HND"``.
    honored_kv_layouts: ClassVar[frozenset[str]] = frozenset({"NHD"})

    def __init__(
        self, *, kv_caches: list[torch.Tensor], device: torch.device, num_layers: int
    ) -> None:
        if not kv_caches:
            raise ValueError("a cache context needs at least one KV-cache tensor")
        self._kv_caches = list(kv_caches)
        self._device = device
        self._num_layers = num_layers
        self._imported_events: dict[int, IPCEvent] = {}
        self._event_tokens = itertools.count(1)
        self._events_lock = threading.Lock()

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def kv_tensors(self) -> list[torch.Tensor]:
        return self._kv_caches

    @property
    def num_layers(self) -> int:
        return self._num_layers

    def hold_imported_event(self, event: IPCEvent) -> int:
        """Keep an imported worker event alive until the stream wait on it has drained."""
        with self._events_lock:
            token = next(self._event_tokens)
            self._imported_events[token] = event
        return token

    def release_imported_event(self, token: int) -> None:
        with self._events_lock:
            self._imported_events.pop(token, None)

    @property
    @abc.abstractmethod
    def layout(self) -> KVLayout:
        """The paged geometry the server plans chunks with (``ValueError`` if it has none)."""

    @abc.abstractmethod
    def get_shape_desc(self, group_idx: int = 0) -> PageBufferShapeDesc:
        """The paged-buffer description of KV group ``group_idx`` for the copy kernels."""

    @abc.abstractmethod
    def transfer_blocks(
        self,
        direction: TransferDirection,
        objects: Sequence[torch.Tensor],
        block_ids: Sequence[int] | torch.Tensor,
        skip_prefix_n_blocks: int = 0,
        wait_for: IPCEvent | None = None,
    ) -> IPCEvent:
        """Copy whole blocks between the mapped KV cache and LMCache chunk objects.

        ``D2H`` gathers ``block_ids`` into ``objects`` (host views shaped
        ``layout.transfer_shape(chunk_size)``), ``H2D`` scatters them back; the first
        ``skip_prefix_n_blocks`` block positions are left alone.  The copy must follow
        ``wait_for`` (an event the server imported from the worker through this device's
        ``EventIPCBackend``, or ``None``) without blocking the host.  Returns an event of that
        backend which completes with the copy; the server waits on it with
        ``synchronize_event`` before it touches the objects again.
        """

    @abc.abstractmethod
    def cache_size_per_token(self) -> int:
        """Bytes of KV cache per token across all layers."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release every mapping and buffer; the context is unusable afterwards."""

    def report_status(self) -> dict[str, object]:
        return {
            "device_type": self.device_type,
            "device": str(self._device),
            "num_layers": self._num_layers,
            "num_kv_tensors": len(self._kv_caches),
        }
