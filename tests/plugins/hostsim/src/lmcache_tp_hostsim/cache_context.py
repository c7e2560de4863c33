"""``HostSimCacheContext``: the server's view of a hostsim worker's KV cache.

It maps the worker's segments (through ``HostSimShmWrapper``), copies blocks with the
hostsim backend's ops (the torch baseline) and answers with ``HostSimEvent``s; it refuses
to follow an event that did not come through ``HostSimEventIPCBackend``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from lmcache.v1.platform import resolve_device_ops
from lmcache.v1.platform.base.cache_context import BaseCacheContext
from lmcache.v1.platform.kv_layout import KVLayout
from lmcache.v1.platform.ops_types import PageBufferShapeDesc, TransferDirection
from lmcache_tp_hostsim._trace import trace
from lmcache_tp_hostsim.events import HostSimEvent

if TYPE_CHECKING:
    from lmcache.v1.platform.base.streams import IPCEvent


class HostSimCacheContext(BaseCacheContext):
    device_type: ClassVar[str] = "hostsim"

    def __init__(
        self, kv_caches: Sequence[Any], lmcache_tokens_per_chunk: int = 256, *_: Any, **__: Any
    ) -> None:
        self._wrappers = [w for w in kv_caches if not isinstance(w, torch.Tensor)]
        try:
            tensors = [w if isinstance(w, torch.Tensor) else w.to_tensor() for w in kv_caches]
            self._layout = KVLayout.from_tensors(tensors)
            self._layout.check_chunk_size(lmcache_tokens_per_chunk)
        except BaseException:
            self.close()
            raise
        super().__init__(kv_caches=tensors, device=torch.device("cpu"), num_layers=len(tensors))
        self._chunk_tokens = lmcache_tokens_per_chunk
        self.transfers = {direction.name: 0 for direction in TransferDirection}

    @property
    def layout(self) -> KVLayout:
        return self._layout

    @property
    def shm_names(self) -> list[str]:
        return [w.shm_name for w in self._wrappers]

    def get_shape_desc(self, group_idx: int = 0) -> PageBufferShapeDesc:
        if group_idx != 0:
            raise IndexError(f"hostsim caches have one KV group, not group {group_idx}")
        return self._layout.shape_desc()

    def cache_size_per_token(self) -> int:
        return self._layout.bytes_per_token()

    def transfer_blocks(
        self,
        direction: TransferDirection,
        objects: Sequence[torch.Tensor],
        block_ids: Sequence[int] | torch.Tensor,
        skip_prefix_n_blocks: int = 0,
        wait_for: IPCEvent | None = None,
    ) -> HostSimEvent:
        if wait_for is not None and not isinstance(wait_for, HostSimEvent):
            raise RuntimeError(f"hostsim cannot follow a foreign event {wait_for!r}")
        resolve_device_ops(self.device_type).multi_layer_block_kv_transfer(
            self.kv_tensors,
            list(objects),
            block_ids,
            self.device,
            direction,
            self.get_shape_desc(0),
            self._chunk_tokens,
            self._layout.engine_kv_format,
            skip_prefix_n_blocks,
        )
        self.transfers[direction.name] += 1
        trace(
            "transfer_blocks",
            direction=direction.name,
            objects=len(objects),
            blocks=len(block_ids),
            waited_on=None if wait_for is None else wait_for.sequence,
        )
        return HostSimEvent(0, recorded=True)

    def close(self) -> None:
        self._kv_caches = []
        for wrapper in self._wrappers:
            wrapper.close()

    def report_status(self) -> dict[str, object]:
        status = super().report_status()
        status["transfers"] = dict(self.transfers)
        return status
