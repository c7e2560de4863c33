"""Copy plans: the numbers one native ``kv_copy`` launch needs, derived from torch views.

The torch baseline already turns every ``EngineKVFormat`` into canonical views ``[KV, NL,
NB, BS, NH, HS]`` (``torch_ops.plan``) and every LMCache buffer into ``[KV, NL, T, NH,
HW]``. A plan reads base addresses and byte strides off those views, so the kernel needs no
per-format code and the argument checks (and their messages) stay the baseline's.

Nothing here touches a GPU: plans are plain integers, which is what lets the CPU test suite
check every layout by executing plans with a host emulator of the kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lmcache.v1.platform.ops_types import PageBufferShapeDesc, TransferDirection
from lmcache.v1.platform.torch_ops import plan as shared
from lmcache.v1.platform.torch_ops.plan import PagedLayout, Unsupported, canonical_object

__all__ = [
    "CopyPlan",
    "ObjectView",
    "Unsupported",
    "engine_plans",
    "object_view",
    "plan_block_transfer",
    "plan_token_transfer",
    "tensor_object_view",
    "uniform_object_strides",
]

AddressFn = Callable[[int], int]
ViewCheck = Callable[[torch.Tensor], None]

# Bytes one CTA should move before it is worth splitting work across more CTAs.
_BYTES_PER_CTA = 16384
_MAX_ITEMS_PER_CTA = 64
_VEC_SIZES = (16, 8, 4, 2)


@dataclass
class CopyPlan:
    """One ``kv_copy`` launch: ``planes`` x ``work`` items of ``rows`` token rows each."""

    # [P, 4] int64 rows: engine base address, kv, layer, column offset (bytes)
    planes: list[tuple[int, int, int, int]]
    # [W, 4] int64 rows: engine offset, object address, object kv / layer strides (bytes)
    work: torch.Tensor = field(default_factory=lambda: torch.empty(0, 4, dtype=torch.int64))
    rows: int = 1
    num_heads: int = 1
    width_bytes: int = 0
    eng_block_stride: int = 0
    eng_row_stride: int = 0
    eng_head_stride: int = 0
    obj_row_stride: int = 0
    obj_head_stride: int = 0
    to_engine: bool = False

    def vector_bytes(self) -> int:
        """Widest load/store every address and stride of the plan is aligned to."""
        acc = self.width_bytes | self.eng_row_stride | self.eng_head_stride
        acc |= self.obj_row_stride | self.obj_head_stride
        for plane in self.planes:
            acc |= plane[0] | plane[3]
        for vec in _VEC_SIZES:
            if acc % vec == 0 and not bool(self.work.remainder(vec).any()):
                return vec
        return 1

    def items_per_cta(self) -> int:
        per_item = max(1, self.rows * self.num_heads * self.width_bytes)
        return max(1, min(_MAX_ITEMS_PER_CTA, _BYTES_PER_CTA // per_item))


def engine_plans(layout: PagedLayout, check_view: Callable[[torch.Tensor], None]) -> list[CopyPlan]:
    """One empty plan per group of engine planes sharing strides and head width."""
    groups: dict[tuple[int, int, int, int, int], CopyPlan] = {}
    for part in layout.parts:
        view = part.view
        check_view(view)
        es = view.element_size()
        s_kv, s_layer, s_block, s_row, s_head, s_col = view.stride()
        hs = view.shape[5]
        if hs > 1 and s_col != 1:
            raise Unsupported("engine head dimension is not contiguous")
        key = (s_block * es, s_row * es, s_head * es, hs * es, view.shape[4])
        plan = groups.get(key)
        if plan is None:
            plan = groups[key] = CopyPlan(
                planes=[],
                num_heads=view.shape[4],
                width_bytes=hs * es,
                eng_block_stride=s_block * es,
                eng_row_stride=s_row * es,
                eng_head_stride=s_head * es,
            )
        kv0 = part.kv.start or 0
        layer0 = part.layers.start or 0
        col = (part.cols.start or 0) * es
        base = view.data_ptr()
        for kv in range(view.shape[0]):
            for layer in range(view.shape[1]):
                addr = base + (kv * s_kv + layer * s_layer) * es
                plan.planes.append((addr, kv0 + kv, layer0 + layer, col))
    return list(groups.values())


@dataclass
class ObjectView:
    """An LMCache buffer as device-visible address plus byte strides of ``[KV, NL, T, NH, HW]``."""

    address: int
    kv_stride: int
    layer_stride: int
    row_stride: int
    head_stride: int
    tokens: int


def object_view(
    obj: Any, layout: PagedLayout, chunk_tokens: int, address_of: AddressFn
) -> ObjectView:
    """Geometry of one LMCache object (a tensor or a raw address of a contiguous chunk)."""
    es = torch.empty(0, dtype=layout.dtype).element_size()
    row = layout.num_heads * layout.head_width * es
    if not isinstance(obj, torch.Tensor):
        address = address_of(int(obj))
        if address == 0:
            raise Unsupported("LMCache object address is not visible to the device")
        per_layer = chunk_tokens * row
        return ObjectView(
            address,
            layout.num_layers * per_layer,
            per_layer,
            row,
            layout.head_width * es,
            chunk_tokens,
        )
    return tensor_object_view(canonical_object(obj, layout), address_of)


def tensor_object_view(canon: torch.Tensor, address_of: AddressFn) -> ObjectView:
    """Geometry of a canonical ``[KV, NL, T, NH, HW]`` view."""
    es = canon.element_size()
    s_kv, s_layer, s_row, s_head, s_col = canon.stride()
    if canon.shape[4] > 1 and s_col != 1:
        raise Unsupported("LMCache buffer is not contiguous in its head dimension")
    if canon.numel() == 0:
        raise Unsupported("empty LMCache buffer")
    address = address_of(canon.data_ptr())
    if address == 0:
        raise Unsupported("LMCache buffer is not visible to the device (pageable host memory)")
    return ObjectView(
        address, s_kv * es, s_layer * es, s_row * es, s_head * es, int(canon.shape[2])
    )


def uniform_object_strides(views: Sequence[ObjectView]) -> tuple[int, int]:
    """(row stride, head stride) shared by every object of a launch."""
    strides = {(v.row_stride, v.head_stride) for v in views}
    if len(strides) != 1:
        raise Unsupported("LMCache objects disagree in row or head stride")
    return next(iter(strides))


def plan_block_transfer(
    paged: Any,
    objects_in: Any,
    block_ids: Any,
    device: Any,
    direction: Any,
    shape_desc: PageBufferShapeDesc,
    chunk_size: int,
    engine_kv_format: Any,
    skip_blocks: int,
    *,
    address_of: AddressFn,
    check_view: ViewCheck,
    layout_of: Callable[..., PagedLayout] = shared.paged_layout,
) -> list[CopyPlan]:
    """Plans for ``multi_layer_block_kv_transfer``; checks exactly as the baseline does."""
    spec, checked, skip, chunk, bpo, ids, objects = shared.block_transfer_args(
        objects_in, block_ids, direction, shape_desc, chunk_size, engine_kv_format, skip_blocks
    )
    to_engine = checked == TransferDirection.H2D
    runs = list(shared.block_runs(ids, bpo, skip, len(objects)))
    if not runs:
        return []
    layout = layout_of(paged, spec, shape_desc, device)
    shared.check_engine_block_size(layout.block_size, shape_desc)
    shared.check_block_runs(runs, layout.num_blocks)
    plans = engine_plans(layout, check_view)
    bs = layout.block_size

    views = []
    columns: list[torch.Tensor] = []
    for obj_index, slots, engine_ids in runs:
        view = object_view(objects[obj_index], layout, chunk, address_of)
        whole_blocks = view.tokens // bs
        slot_ids = (
            torch.arange(slots.start, slots.stop, dtype=torch.int64)
            if isinstance(slots, slice)
            else slots.to(torch.int64)
        )
        shared.check_block_slot(obj_index, int(slot_ids.max()), whole_blocks, ValueError)
        views.append(view)
        count = slot_ids.numel()
        columns.append(
            torch.stack(
                [
                    engine_ids.to("cpu", torch.int64),
                    view.address + slot_ids * (bs * view.row_stride),
                    torch.full((count,), view.kv_stride, dtype=torch.int64),
                    torch.full((count,), view.layer_stride, dtype=torch.int64),
                ],
                dim=1,
            )
        )
    row_stride, head_stride = uniform_object_strides(views)
    items = torch.cat(columns)
    for plan in plans:
        work = items.clone()
        work[:, 0] *= plan.eng_block_stride
        plan.work = work
        plan.rows = bs
        plan.obj_row_stride = row_stride
        plan.obj_head_stride = head_stride
        plan.to_engine = to_engine
    return plans


def plan_token_transfer(
    layout: PagedLayout,
    lmcache_buffer: torch.Tensor,
    slot_mapping: Any,
    direction: Any,
    skip: int = 0,
    page_buffer_size: int = 0,
    *,
    address_of: AddressFn,
    check_view: ViewCheck,
) -> list[CopyPlan]:
    """Plans for the baseline's shared token path (``mem_kernels._transfer_tokens``)."""
    to_engine = shared.validate_direction(direction) == TransferDirection.H2D
    lmc = canonical_object(lmcache_buffer, layout)
    positions, slots = shared.selected_tokens(slot_mapping, skip, page_buffer_size)
    if slots.numel() == 0:
        return []
    pos = (
        torch.arange(positions.start, positions.stop, dtype=torch.int64)
        if isinstance(positions, slice)
        else positions.to(torch.int64)
    )
    shared.check_token_coverage(int(pos.max()), lmc.shape[2])
    plans = engine_plans(layout, check_view)
    view = tensor_object_view(lmc, address_of)
    blocks, offsets = slots // layout.block_size, slots % layout.block_size
    count = pos.numel()
    obj_col = view.address + pos * view.row_stride
    kv_col = torch.full((count,), view.kv_stride, dtype=torch.int64)
    layer_col = torch.full((count,), view.layer_stride, dtype=torch.int64)
    for plan in plans:
        engine_col = blocks * plan.eng_block_stride + offsets * plan.eng_row_stride
        plan.work = torch.stack([engine_col, obj_col, kv_col, layer_col], dim=1)
        plan.rows = 1
        plan.obj_row_stride = view.row_stride
        plan.obj_head_stride = view.head_stride
        plan.to_engine = to_engine
    return plans
