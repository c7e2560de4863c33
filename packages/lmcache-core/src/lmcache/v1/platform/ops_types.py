"""Shared descriptor types for the ``DeviceOps`` surface.

Upstream defines the two enums and the two descriptor structs natively; here they are plain
Python so that the torch baseline (and every backend without a native module) has them.
A backend's native module may overlay any of them through ``DeviceOps.bind_native``.

The plan types consumed by the native object-group transfer executor (``StagingCopy``,
``LaunchVar``, ``BatchStep``) have no pure-Python implementation: constructing one raises
``NotImplementedError`` until a native module binds the real type.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmcache.v1.platform.kv_formats import EngineKVFormat, format_spec

__all__ = [
    "KVIndexError",
    "EventRecord",
    "BatchStep",
    "EngineKVFormat",
    "GPUKVFormat",
    "KernelGroupSpec",
    "LaunchVar",
    "PageBufferShapeDesc",
    "StagingCopy",
    "TransferDirection",
    "TransferPhase",
    "is_cross_layer",
    "is_kv_list",
    "is_kv_second_tuple",
    "is_layer_list",
    "is_mla",
]

# One stream-ordered event record, as ``DeviceOps.drain_recorded_events`` returns it:
# (event type, session id, timestamp, string metadata, integer metadata).
EventRecord = tuple[str, str, float, dict[str, str], dict[str, int]]


class KVIndexError(IndexError, ValueError):
    """A block id or slot outside the engine buffers; raised before any byte is written.

    Also a ``ValueError``, so callers written against upstream's baseline (which raises
    ``ValueError`` for these inputs) keep working.  Native backends raise this same class.
    """


class TransferDirection(enum.IntEnum):
    """Direction of a KV transfer, seen from the engine's paged buffer."""

    H2D = 0  # LMCache buffer -> paged engine buffer (load / retrieve)
    D2H = 1  # paged engine buffer -> LMCache buffer (store / extract)


# Backward-compatible alias kept by upstream for callers written before the rename.
GPUKVFormat = EngineKVFormat


def _flag(fmt: int, name: str) -> bool:
    return bool(getattr(format_spec(fmt), name))


def is_kv_list(fmt: int) -> bool:
    """True for ``2 x NL x [...]`` layouts (separate K and V lists)."""
    return _flag(fmt, "kv_list")


def is_layer_list(fmt: int) -> bool:
    """True for ``NL x [...]`` layouts (one tensor or tuple per layer)."""
    return _flag(fmt, "layer_list")


def is_cross_layer(fmt: int) -> bool:
    """True for layouts held in one tensor spanning every layer."""
    return _flag(fmt, "cross_layer")


def is_mla(fmt: int) -> bool:
    """True for MLA-style layouts (one latent plane, no separate K and V)."""
    return _flag(fmt, "mla")


def is_kv_second_tuple(fmt: int) -> bool:
    """True for layouts whose per-layer entry is a tuple of tensors."""
    return _flag(fmt, "kv_second_tuple")


class PageBufferShapeDesc:
    """Shape of one engine page buffer, as the block-transfer kernels need it.

    Mirrors the native struct: a no-argument constructor and settable attributes. The
    keyword constructor is an addition for readability.

    Attributes:
        kv_size: 2 when K and V are separate planes, 1 for MLA and fused K|V layouts.
        nl, nb, bs, nh, hs: layers, blocks, block size (tokens), KV heads, head size. For
            fused K|V layouts ``hs`` is the fused per-head width (``2 * HS`` or ``CS``).
        element_size: bytes per element (used to infer the dtype in pointer mode).
        block_stride_elems: elements between consecutive blocks; 0 means tightly packed.
        dtype: the torch dtype, or None to infer it from ``element_size``.
    """

    __slots__ = (
        "block_stride_elems",
        "bs",
        "dtype",
        "element_size",
        "hs",
        "kv_size",
        "nb",
        "nh",
        "nl",
    )

    def __init__(
        self,
        kv_size: int = 2,
        nl: int = 0,
        nb: int = 0,
        bs: int = 0,
        nh: int = 0,
        hs: int = 0,
        element_size: int = 0,
        block_stride_elems: int = 0,
        dtype: Any = None,
    ) -> None:
        self.kv_size = kv_size
        self.nl = nl
        self.nb = nb
        self.bs = bs
        self.nh = nh
        self.hs = hs
        self.element_size = element_size
        self.block_stride_elems = block_stride_elems
        self.dtype = dtype

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _SHAPE_DESC_FIELDS)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in _SHAPE_DESC_FIELDS)
        return f"PageBufferShapeDesc({inner})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PageBufferShapeDesc):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, like the native struct


_SHAPE_DESC_FIELDS = (
    "kv_size",
    "nl",
    "nb",
    "bs",
    "nh",
    "hs",
    "element_size",
    "block_stride_elems",
    "dtype",
)


@dataclass
class KernelGroupSpec:
    """Backend-agnostic descriptor for one blocked-transfer kernel group.

    One group is a set of LMCache objects moved with one page-buffer layout by the native
    object-group executor; ``block_ids_base``/``block_ids_capacity`` locate the group's
    slice in the executor's block-id staging array.
    """

    paged_buffer_ptrs: int
    lmcache_objects_ptrs: Sequence[int]
    shape_desc: PageBufferShapeDesc
    lmcache_chunk_size: int
    engine_kv_format: int
    block_ids_base: int
    block_ids_capacity: int


class TransferPhase(enum.IntEnum):
    """Timed sections of the native object-group transfer executor.

    The values appear in ``device_ops.pop_completed_phase_timings()`` samples.
    """

    KERNEL = 0
    STAGING = 1


class _NativePlanType:
    """Placeholder for a plan struct that only a native backend module can build."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} requires a backend-specific native module; "
            "no generic pure-Python fallback exists."
        )


class StagingCopy(_NativePlanType):
    """One asynchronous host<->device copy of a transfer plan (native only).

    Native constructor: ``StagingCopy(dest: uintptr, src: uintptr, nbytes: size_t,
    host_offset: size_t)``. ``host_offset`` is the host-side virtual offset inside the
    LMCache allocator: the source for H2D, the destination for D2H.
    """


class LaunchVar(_NativePlanType):
    """One kernel launch of a transfer plan (native only).

    Native constructor: ``LaunchVar(group_idx: int, block_ids_offset: int64,
    total_blocks: int, num_objects: int, skip_prefix_n_blocks: int)``; ``group_idx``
    indexes the executor's ``kernel_group_specs`` and ``num_objects`` is 1-4 chunks.
    """


class BatchStep(_NativePlanType):
    """One step of a transfer plan (native only).

    Native constructor: ``BatchStep(staging: list[StagingCopy], launches:
    list[LaunchVar])``. H2D runs the staging copies before the launches, D2H after.
    """
