"""The worker-side transfer context's interface and helpers shared by both modes.

Also upstream LMCache 0.5.6's ``transfer_context.base`` API for engine-driven transfer:
the two-phase transport interface :class:`EngineDrivenContext` (its factory,
:func:`.transports.create_engine_driven_context`, lives beside the transports),
:func:`compute_kv_layout`, and the paged-KV <-> CPU chunk copies
:func:`gather_paged_kv_to_cpu` / :func:`scatter_cpu_to_paged_kv`, which run the
``multi_layer_block_kv_transfer`` op of the backend serving the KV tensors' device.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

from lmcache.v1.multiprocess.wire.custom_types import EngineType, IPCCacheServerKey
from lmcache.v1.platform import resolve_device_ops, synchronize_device
from lmcache.v1.platform.kv_layout import KVLayout, as_layer_views, dtype_name
from lmcache.v1.platform.ops_types import EngineKVFormat, TransferDirection
from lmcache.v1.platform.transfer_mode import MPTransferMode

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class QueryableFuture(Future[_T]):
    """A ``concurrent.futures.Future`` with upstream's non-blocking ``query()``: what the
    transfer contexts return, so both our worker (``result``, ``done``) and code written
    for upstream's ``MessagingFuture`` (``query``) can wait on it.  Not
    :class:`lmcache.compat.upstream_056.futures.MessagingFuture`, which is the wire client's
    future."""

    def query(self) -> bool:
        """Whether the result (or exception) is set; never waits."""
        return self.done()


def _done(value: Any) -> QueryableFuture[Any]:
    future: QueryableFuture[Any] = QueryableFuture()
    future.set_result(value)
    return future


def _failed(exc: BaseException) -> QueryableFuture[Any]:
    future: QueryableFuture[Any] = QueryableFuture()
    future.set_exception(exc)
    return future


def _single_group_block_ids(block_ids: Sequence[Sequence[int]]) -> list[int]:
    """The block ids of the one KV-cache group engine-driven transfer handles."""
    if len(block_ids) != 1:
        raise RuntimeError(
            f"engine-driven transfer handles one KV-cache group, got {len(block_ids)} "
            "(hybrid KV-cache groups are not supported)"
        )
    return list(block_ids[0])


def _tensor_list(
    kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
) -> list[torch.Tensor]:
    return list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)


class TransferContext(abc.ABC):
    """One worker's connection of its KV cache to the server."""

    mode: MPTransferMode

    def __init__(self, instance_id: int, req_client: Any) -> None:
        self.instance_id = instance_id
        self.req_client = req_client
        self.chunk_size = 0
        self.layout: KVLayout | None = None
        self._kv: list[torch.Tensor] = []

    @abc.abstractmethod
    def register(
        self,
        kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
        model_name: str,
        world_size: int,
        blocks_in_chunk: int,
        mq_timeout: float,
        layout_hints: Any = None,
        engine_group_infos: Sequence[Any] = (),
        engine_type: EngineType = EngineType.VLLM,
    ) -> None: ...

    @abc.abstractmethod
    def register_again(self) -> None:
        """Register once more, as the last ``register`` did, with a server that restarted.

        The new server process never knew this worker, so nothing is unregistered first.
        """

    @abc.abstractmethod
    def unregister(self) -> Future[Any] | None: ...

    def create_recorded_event(self) -> Any:
        return None

    @abc.abstractmethod
    def submit_store(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: Any,
        blocks_in_chunk: int,
    ) -> Future[bool]: ...

    @abc.abstractmethod
    def submit_retrieve(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: Any,
        blocks_in_chunk: int,
        skip_first_n_tokens: int = 0,
    ) -> Future[bool]: ...

    def flush_inflight_stores(self) -> None:  # noqa: B027 - nothing in flight by default
        """Stores complete before ``submit_store`` returns; nothing is in flight."""

    def close(self) -> None:
        try:
            self.unregister()
        except Exception:
            logger.debug("unregister during close failed", exc_info=True)

    def _setup(
        self, kv: list[torch.Tensor], blocks_in_chunk: int, layout_hints: Any = None
    ) -> KVLayout:
        """Remember the KV tensors (as the per-layer views ``layout_hints`` asks for)."""
        kv = as_layer_views(kv, layout_hints)
        layout = KVLayout.from_tensors(kv)
        self.layout = layout
        self._kv = kv
        self.chunk_size = blocks_in_chunk * layout.block_size
        return layout


# -- upstream 0.5.6's engine-driven transport interface ----------------------------------


@dataclasses.dataclass(frozen=True)
class ChunkLayoutDesc:
    """Shapes and dtypes of one chunk's tensors (upstream's ``MemoryLayoutDesc``)."""

    shapes: list[torch.Size]
    dtypes: list[torch.dtype]


@dataclasses.dataclass(frozen=True)
class EngineDrivenContextMetadata:
    """What a transport needs to know about the chunks it moves."""

    layout_desc: ChunkLayoutDesc
    block_size: int
    use_mla: bool


class EngineDrivenContext(abc.ABC):
    """How engine-driven chunks reach the server: ``prepare_*`` then ``commit_*``.

    ``prepare_store`` returns ``None`` (the caller gathers every chunk into buffers of its
    own), ``([], [])`` (nothing to write; the caller skips gather and commit) or
    ``(buffers, chunk_indices)``: the caller gathers chunk ``chunk_indices[i]`` into
    ``buffers[i]``, then ``commit_store`` hands them to the server.  ``prepare_retrieve``
    returns the chunk tensors to scatter (``None`` on a miss); ``commit_retrieve`` tells
    the server the caller is done reading them.
    """

    def __init__(
        self, metadata: EngineDrivenContextMetadata, req_client: Any, mq_timeout: float
    ) -> None:
        self.metadata = metadata
        self.req_client = req_client
        self.mq_timeout = mq_timeout

    @property
    def layout_desc(self) -> ChunkLayoutDesc:
        return self.metadata.layout_desc

    @abc.abstractmethod
    def prepare_store(
        self, key: IPCCacheServerKey, instance_id: int
    ) -> tuple[list[torch.Tensor], list[int]] | None: ...

    @abc.abstractmethod
    def commit_store(
        self, key: IPCCacheServerKey, instance_id: int, chunks: list[torch.Tensor]
    ) -> bool: ...

    @abc.abstractmethod
    def prepare_retrieve(
        self, key: IPCCacheServerKey, instance_id: int
    ) -> list[torch.Tensor] | None: ...

    @abc.abstractmethod
    def commit_retrieve(self, key: IPCCacheServerKey, instance_id: int) -> bool: ...

    @abc.abstractmethod
    def close(self) -> None: ...


# -- paged KV <-> CPU chunks ----------------------------------------------------------------


def _paged_kv(
    kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor], layout_hints: Any
) -> tuple[list[torch.Tensor], KVLayout]:
    """The KV tensors seen in the layout the block-transfer op takes, and that layout."""
    tensors = _tensor_list(kv_caches)
    if not tensors:
        raise ValueError("no KV-cache tensors given")
    views = as_layer_views(tensors, layout_hints)
    return views, KVLayout.from_tensors(views)


def compute_kv_layout(
    kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
    layout_hints: Any = None,
    engine_type: EngineType = EngineType.VLLM,
) -> tuple[int, int, int, str, EngineKVFormat, int]:
    """``(block_size, num_layers, hidden_dim_size, dtype_str, engine_kv_format, kv_size)``.

    ``hidden_dim_size`` is one token's width in a chunk (heads times head size) and
    ``kv_size`` the number of planes (1 for MLA, else 2: K and V).  ``engine_type`` is
    accepted for upstream's signature; every engine lmcache-core serves hands over the
    same layouts.
    """
    del engine_type
    _, layout = _paged_kv(kv_caches, layout_hints)
    return (
        layout.block_size,
        layout.num_layers,
        layout.hidden_dim_size,
        dtype_name(layout.dtype),
        layout.engine_kv_format,
        1 if layout.use_mla else 2,
    )


def _chunk_block_ids(
    block_ids: Sequence[int], blocks_per_chunk: int, chunk_indices: Sequence[int]
) -> list[int]:
    selected: list[int] = []
    for index in chunk_indices:
        selected.extend(block_ids[index * blocks_per_chunk : (index + 1) * blocks_per_chunk])
    return selected


def gather_paged_kv_to_cpu(
    kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
    block_ids: Sequence[int],
    blocks_per_chunk: int,
    layout_hints: Any = None,
    engine_kv_format: EngineKVFormat | None = None,
    out: list[torch.Tensor] | None = None,
    chunk_indices: Sequence[int] | None = None,
    engine_type: EngineType = EngineType.VLLM,
) -> list[torch.Tensor]:
    """Copy paged KV blocks into CPU chunk tensors, one per chunk.

    Chunk ``c`` holds blocks ``block_ids[c*blocks_per_chunk : (c+1)*blocks_per_chunk]``;
    ``chunk_indices`` selects chunks (default: every whole chunk).  Chunks are shaped
    ``[2, num_layers, tokens, hidden]`` (K, V) or ``[num_layers, tokens, hidden]`` (MLA).
    With ``out`` the chunks are written into ``out[i]`` (extra buffers are ignored; when
    there are none, ``out`` itself is returned), any CPU memory, shared or pinned or not.

    The KV tensors' device picks the backend ops, never the process-wide selected backend.
    An accelerator backend may still be copying when this returns: synchronize the KV
    device before reading the chunks.
    """
    del engine_type
    tensors, layout = _paged_kv(kv_caches, layout_hints)
    indices = (
        list(chunk_indices)
        if chunk_indices is not None
        else list(range(len(block_ids) // blocks_per_chunk))
    )
    chunk_tokens = blocks_per_chunk * layout.block_size
    if out is None:
        shape = layout.transfer_shape(chunk_tokens)
        chunks = [torch.empty(shape, dtype=layout.dtype) for _ in indices]
    elif len(out) < len(indices):
        raise ValueError(
            f"out has {len(out)} buffers, fewer than the {len(indices)} chunks to gather"
        )
    else:
        chunks = out if len(out) == len(indices) else out[: len(indices)]
    selected = _chunk_block_ids(block_ids, blocks_per_chunk, indices)
    if selected:
        device = tensors[0].device
        resolve_device_ops(device.type).multi_layer_block_kv_transfer(
            tensors,
            chunks,
            selected,
            device,
            TransferDirection.D2H,
            layout.shape_desc(),
            chunk_tokens,
            engine_kv_format if engine_kv_format is not None else layout.engine_kv_format,
            0,
        )
    return chunks


def scatter_cpu_to_paged_kv(
    kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
    block_ids: Sequence[int],
    chunks: list[torch.Tensor],
    blocks_per_chunk: int,
    skip_first_n_tokens: int = 0,
    layout_hints: Any = None,
    engine_kv_format: EngineKVFormat | None = None,
    engine_type: EngineType = EngineType.VLLM,
) -> None:
    """Copy CPU chunk tensors (as :func:`gather_paged_kv_to_cpu` makes them) into KV blocks.

    ``block_ids`` needs ``len(chunks) * blocks_per_chunk`` ids (extra ids are ignored),
    except that the last chunk may be partial (fewer ids: its first blocks only).
    The first ``skip_first_n_tokens`` tokens are left alone; the block transfer skips
    whole blocks only, so a count that is not block-aligned is rounded down (and logged).

    When any chunk is not pinned, this returns only once the KV device finished reading
    the chunks, so the caller may release them at once (a shared-memory slot, say);
    pinned chunks are the caller's to keep alive until it synchronizes the device.
    """
    del engine_type
    if not chunks:
        return
    if len(block_ids) <= (len(chunks) - 1) * blocks_per_chunk:
        raise ValueError(
            f"{len(block_ids)} block ids cannot fill {len(chunks)} chunks of "
            f"{blocks_per_chunk} blocks"
        )
    tensors, layout = _paged_kv(kv_caches, layout_hints)
    skip = max(0, int(skip_first_n_tokens))
    if skip % layout.block_size:
        logger.error(
            "skip_first_n_tokens %d is not a multiple of the block size %d; skipping %d blocks",
            skip,
            layout.block_size,
            skip // layout.block_size,
        )
    selected = list(block_ids[: len(chunks) * blocks_per_chunk])
    device = tensors[0].device
    resolve_device_ops(device.type).multi_layer_block_kv_transfer(
        tensors,
        chunks,
        selected,
        device,
        TransferDirection.H2D,
        layout.shape_desc(),
        blocks_per_chunk * layout.block_size,
        engine_kv_format if engine_kv_format is not None else layout.engine_kv_format,
        skip // layout.block_size,
    )
    if not all(chunk.is_pinned() for chunk in chunks):
        synchronize_device(device)
