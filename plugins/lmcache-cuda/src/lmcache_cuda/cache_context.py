"""``CudaCacheContext``: a worker's CUDA KV cache mapped into the cache server process.

Built by ``CudaDeviceSpec.create_cache_context`` from the wrappers the worker registered
(``CudaIPCWrapper``; plain CUDA tensors are accepted for in-process use). It owns the mapped
tensors, a private copy stream, the per-layer pointer table the kernels read, and the event
handshake that orders the server's copies after the worker's writes (and the worker's next
use after the server's reads) without any device-wide synchronization.

The MP cache server drives it through the ``BaseCacheContext`` contract: it reads
:attr:`CudaCacheContext.layout` at registration, then calls
:meth:`CudaCacheContext.transfer_blocks` with the worker's event (imported through the CUDA
event-IPC backend) and waits on the event it returns.

Positional arguments after the wrappers follow upstream's factory order
(``lmcache_tokens_per_chunk, layout_hints, engine_group_infos, engine_type, ...``); only the
chunk size and an optional ``engine_kv_format`` (keyword, or on ``layout_hints``) are used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch

from lmcache.v1.platform.base.cache_context import BaseCacheContext
from lmcache.v1.platform.kernel_kit.views import PagedLayout, paged_layout_from_tensors
from lmcache.v1.platform.kv_formats import KVFormatSpec, format_spec
from lmcache.v1.platform.kv_layout import KVLayout
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc, TransferDirection

if TYPE_CHECKING:
    from lmcache.v1.platform.base.streams import IPCEvent

# The engine layouts the MP server's ``KVLayout`` understands.
_SERVER_FORMATS = (EngineKVFormat.NL_X_TWO_NB_BS_NH_HS, EngineKVFormat.NL_X_NB_BS_HS)

# Engine tensor rank -> layout when the worker sent no hint (vLLM's defaults).
_DEFAULT_FORMAT_BY_RANK = {
    3: EngineKVFormat.NL_X_NB_BS_HS,  # MLA [NB, BS, HS]
    5: EngineKVFormat.NL_X_TWO_NB_BS_NH_HS,  # flash-attn [2, NB, BS, NH, HS]
    6: EngineKVFormat.NB_NL_TWO_BS_NH_HS,  # cross-layer [NB, NL, 2, BS, NH, HS]
}


def _as_tensor(entry: Any) -> torch.Tensor:
    if isinstance(entry, torch.Tensor):
        return entry
    return entry.to_tensor()


def _infer_format(tensors: Sequence[torch.Tensor], hint: Any) -> EngineKVFormat:
    if hint is not None:
        return EngineKVFormat(int(hint))
    fmt = _DEFAULT_FORMAT_BY_RANK.get(tensors[0].dim())
    if fmt is None:
        raise ValueError(
            f"cannot infer the engine KV layout of a {tensors[0].dim()}-d cache; pass "
            "engine_kv_format"
        )
    return fmt


def _block_size(tensor: torch.Tensor, fmt: EngineKVFormat) -> int:
    dims = format_spec(fmt).dims
    return int(tensor.shape[dims.index("BS")]) if "BS" in dims else 1


class CudaCacheContext(BaseCacheContext):
    """The server-side view of one worker's CUDA KV cache."""

    device_type: ClassVar[str] = "cuda"

    def __init__(
        self,
        kv_caches: Sequence[Any],
        lmcache_tokens_per_chunk: int = 256,
        layout_hints: Any = None,
        *_upstream_args: Any,
        engine_kv_format: int | None = None,
        **_upstream_kwargs: Any,
    ) -> None:
        if not kv_caches:
            raise ValueError("CudaCacheContext needs at least one KV-cache entry")
        tensors = [_as_tensor(entry) for entry in kv_caches]
        devices = {t.device for t in tensors}
        if len(devices) != 1 or next(iter(devices)).type != "cuda":
            names = sorted(map(str, devices))
            raise ValueError(f"KV caches must share one CUDA device, got {names}")
        hint = engine_kv_format
        if hint is None and layout_hints is not None:
            hint = getattr(layout_hints, "engine_kv_format", None)
        self._format = _infer_format(tensors, hint)
        self._layout: PagedLayout = paged_layout_from_tensors(
            tensors
            if len(tensors) > 1 or self._format != EngineKVFormat.NB_NL_TWO_BS_NH_HS
            else tensors[0],
            _spec(self._format),
            _block_size(tensors[0], self._format),
        )
        super().__init__(
            kv_caches=tensors, device=tensors[0].device, num_layers=self._layout.num_layers
        )
        self._wrappers = [e for e in kv_caches if not isinstance(e, torch.Tensor)]
        self._chunk_tokens = int(lmcache_tokens_per_chunk)
        self._stream: torch.cuda.Stream | None = None
        self._pointer_table: torch.Tensor | None = None
        self._server_layout: KVLayout | None = None

    # -- layout ---------------------------------------------------------------------------
    @property
    def engine_kv_format(self) -> EngineKVFormat:
        return self._format

    @property
    def lmcache_tokens_per_chunk(self) -> int:
        return self._chunk_tokens

    @property
    def num_blocks(self) -> int:
        return self._layout.num_blocks

    @property
    def block_size(self) -> int:
        return self._layout.block_size

    def cache_size_per_token(self) -> int:
        layout = self._layout
        itemsize = torch.empty(0, dtype=layout.dtype).element_size()
        row = layout.num_heads * layout.head_width * itemsize
        return layout.spec.kv_size * layout.num_layers * row

    @property
    def layout(self) -> KVLayout:
        """The MP server's chunk geometry (per-layer flash-attention or MLA caches only)."""
        if self._server_layout is None:
            if self._format not in _SERVER_FORMATS:
                raise ValueError(
                    f"the MP cache server plans chunks for per-layer [2, NB, BS, NH, HS] or "
                    f"MLA [NB, BS, HS] caches, not {self._format.name}"
                )
            layout = KVLayout.from_tensors(self.kv_tensors)
            layout.check_chunk_size(self._chunk_tokens)
            self._server_layout = layout
        return self._server_layout

    def get_shape_desc(self, group_idx: int = 0) -> PageBufferShapeDesc:
        if group_idx != 0:
            raise IndexError(f"CudaCacheContext has one KV group, not group {group_idx}")
        layout = self._layout
        itemsize = torch.empty(0, dtype=layout.dtype).element_size()
        return PageBufferShapeDesc(
            kv_size=layout.spec.kv_size,
            nl=layout.num_layers,
            nb=layout.num_blocks,
            bs=layout.block_size,
            nh=layout.num_heads,
            hs=layout.head_width,
            element_size=itemsize,
            dtype=layout.dtype,
        )

    def object_shape(self, num_tokens: int | None = None) -> tuple[int, ...]:
        """Shape of one LMCache chunk object for this cache (upstream's pointer shape)."""
        return self._layout.object_shape(num_tokens or self._chunk_tokens)

    # -- device resources ------------------------------------------------------------------
    @property
    def stream(self) -> torch.cuda.Stream:
        """The private stream every server-side copy of this context runs on."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        return self._stream

    def get_kv_pointers(self) -> torch.Tensor:
        """Per-buffer device addresses (int64, on the device) in the engine's order."""
        if self._pointer_table is None:
            ptrs = [t.data_ptr() for t in self.kv_tensors]
            self._pointer_table = torch.tensor(ptrs, dtype=torch.int64, device=self.device)
        return self._pointer_table

    # -- transfers ---------------------------------------------------------------------------
    def transfer_blocks(
        self,
        direction: TransferDirection,
        objects: Sequence[torch.Tensor],
        block_ids: Sequence[int] | torch.Tensor,
        skip_prefix_n_blocks: int = 0,
        wait_for: IPCEvent | None = None,
    ) -> torch.cuda.Event:
        """Copy whole blocks between the mapped cache and LMCache objects on :attr:`stream`.

        ``wait_for`` is an event (e.g. imported from the worker through the event-IPC
        backend) the copy must follow; the returned event completes with the copy. Only
        streams wait: the host never blocks here.
        """
        from lmcache.v1.platform import get_device_spec

        spec = get_device_spec("cuda")
        ops = spec.get_ops() if spec is not None else None
        stream = self.stream
        if wait_for is not None:
            # The server imported it through this device's event backend: a CUDA event.
            stream.wait_event(cast(torch.cuda.Event, wait_for))
        paged = self.kv_tensors if len(self.kv_tensors) > 1 else self.kv_tensors[0]
        with torch.cuda.stream(stream):
            transfer = (
                ops.multi_layer_block_kv_transfer if ops is not None else _baseline_block_transfer
            )
            transfer(
                paged,
                list(objects),
                block_ids,
                self.device,
                direction,
                self.get_shape_desc(),
                self._chunk_tokens,
                self._format,
                skip_prefix_n_blocks,
            )
            done = torch.cuda.Event()
            done.record(stream)
        return done

    def close(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()  # in-flight copies still read the mapped memory
        for wrapper in self._wrappers:
            wrapper.close()
        self._wrappers = []
        self._pointer_table = None
        self._stream = None

    def report_status(self) -> dict[str, object]:
        status = super().report_status()
        status.update(
            engine_kv_format=self._format.name,
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            cache_size_per_token=self.cache_size_per_token(),
        )
        return status


def _spec(fmt: EngineKVFormat) -> KVFormatSpec:
    return format_spec(fmt)


def _baseline_block_transfer(*args: Any) -> None:
    from lmcache.v1.platform import torch_ops

    torch_ops.multi_layer_block_kv_transfer(*args)
