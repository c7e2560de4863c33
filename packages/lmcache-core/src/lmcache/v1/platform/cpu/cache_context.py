"""``CPUCacheContext``: the server's view of a worker KV cache that lives in POSIX SHM.

The worker's per-layer KV tensors are mapped into the server (zero-copy) through their
``CpuShmTensorWrapper``s (a declared ``kv_layout: "HND"`` is re-viewed as NHD, no copy);
``store`` gathers blocks straight out of those pages and
``retrieve`` scatters straight into them (:meth:`CPUCacheContext.transfer_blocks`, with
the cpu backend's ops).  Host copies are synchronous, so there is no stream (``stream`` is
``None``) and the event ``transfer_blocks`` returns is already complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from lmcache.v1.platform.base.cache_context import BaseCacheContext
from lmcache.v1.platform.cpu.event_ipc import HostEvent
from lmcache.v1.platform.kv_layout import (
    HONORED_KV_LAYOUTS,
    KVLayout,
    as_layer_views,
)
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc, TransferDirection

if TYPE_CHECKING:
    from lmcache.v1.platform.base.streams import IPCEvent


class CPUCacheContext(BaseCacheContext):
    device_type: ClassVar[str] = "cpu"
    honored_kv_layouts: ClassVar[frozenset[str]] = HONORED_KV_LAYOUTS

    def __init__(
        self,
        kv_caches: Sequence[Any],
        lmcache_tokens_per_chunk: int = 256,
        layout_hints: Any = None,
        engine_group_infos: Sequence[Any] = (),
        engine_type: Any = None,
        separate_object_groups: bool = False,
        full_sw_kv: bool = False,
    ) -> None:
        self._wrappers = [w for w in kv_caches if not isinstance(w, torch.Tensor)]
        try:
            tensors = [w if isinstance(w, torch.Tensor) else w.to_tensor() for w in kv_caches]
            for tensor in tensors:
                if tensor.device.type != "cpu":
                    raise ValueError(f"CPUCacheContext got a tensor on {tensor.device}")
            tensors = as_layer_views(tensors, layout_hints)
            self._layout = KVLayout.from_tensors(tensors)
            self._layout.check_chunk_size(lmcache_tokens_per_chunk)
        except BaseException:
            self._close_wrappers()
            raise
        super().__init__(kv_caches=tensors, device=torch.device("cpu"), num_layers=len(tensors))
        self.lmcache_tokens_per_chunk = lmcache_tokens_per_chunk
        self._shape_desc = self.layout.shape_desc()

    @property
    def layout(self) -> KVLayout:
        return self._layout

    @property
    def stream(self) -> None:
        return None

    @property
    def num_blocks(self) -> int:
        return self.layout.num_blocks

    @property
    def block_size(self) -> int:
        return self.layout.block_size

    def get_shape_desc(self, group_idx: int = 0) -> PageBufferShapeDesc:
        return self._shape_desc

    def get_engine_kv_format(self, kg_idx: int = 0) -> EngineKVFormat:
        return self.layout.engine_kv_format

    def cache_size_per_token(self) -> int:
        return self.layout.bytes_per_token()

    def transfer_blocks(
        self,
        direction: TransferDirection,
        objects: Sequence[torch.Tensor],
        block_ids: Sequence[int] | torch.Tensor,
        skip_prefix_n_blocks: int = 0,
        wait_for: IPCEvent | None = None,
    ) -> HostEvent:
        """Gather (D2H) or scatter (H2D) blocks with the cpu backend's ops, synchronously.

        ``wait_for`` needs no wait: a host event is complete once the worker sends it.
        """
        from lmcache.v1.platform import resolve_device_ops

        resolve_device_ops(self.device_type).multi_layer_block_kv_transfer(
            self.kv_tensors,
            list(objects),
            block_ids,
            self.device,
            direction,
            self._shape_desc,
            self.lmcache_tokens_per_chunk,
            self.layout.engine_kv_format,
            skip_prefix_n_blocks,
        )
        return HostEvent()

    @property
    def shm_names(self) -> list[str]:
        return [str(getattr(w, "shm_name", "")) for w in self._wrappers if hasattr(w, "shm_name")]

    def _close_wrappers(self) -> None:
        for wrapper in self._wrappers:
            wrapper.close()

    def close(self) -> None:
        self._kv_caches = []
        self._close_wrappers()

    def report_status(self) -> dict[str, object]:
        status = super().report_status()
        status.update(
            block_size=self.layout.block_size,
            num_blocks=self.layout.num_blocks,
            engine_kv_format=self.layout.engine_kv_format.name,
            shm_segments=len(set(self.shm_names)),
        )
        return status
