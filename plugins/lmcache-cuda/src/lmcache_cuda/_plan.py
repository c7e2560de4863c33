"""Launch plans: the numbers one native ``kv_copy`` launch needs, and how to tune it.

The kit (:mod:`lmcache.v1.platform.kernel_kit`) has already checked the arguments and
described the engine buffers as plane groups and the LMCache buffers as byte strides. A plan
turns that into the kernel's work list -- one row per block or token to move -- plus the
launch tuning (vector width, items per CTA). Nothing here touches a GPU: plans are plain
integers, so the CPU test suite executes them with a host emulator of the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from lmcache.v1.platform.kernel_kit import checks
from lmcache.v1.platform.kernel_kit.checks import Unsupported
from lmcache.v1.platform.kernel_kit.geometry import EngineGeometry, ObjectGeometry
from lmcache.v1.platform.kernel_kit.kernels import BlockCopy, KVKernels, SlotCopy

__all__ = ["CopyPlan", "PlanKernels", "block_plans", "engine_plans", "slot_plans"]

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


def engine_plans(geom: EngineGeometry) -> list[CopyPlan]:
    """One plan (no work yet) per plane group of the engine geometry."""
    es = geom.itemsize
    plans = []
    for group in geom.groups:
        planes = [
            (base, kv, layer, col * es)
            for base, kv, layer, col in zip(group.bases, group.kv, group.layers, group.cols)
        ]
        plans.append(
            CopyPlan(
                planes=planes,
                num_heads=geom.num_heads,
                width_bytes=group.width * es,
                eng_block_stride=group.block_stride * es,
                eng_row_stride=group.tok_stride * es,
                eng_head_stride=group.head_stride * es,
            )
        )
    return plans


def _uniform_strides(views: Sequence[ObjectGeometry]) -> tuple[int, int]:
    """(row stride, head stride) shared by every object of a launch."""
    strides = {(v.row_stride, v.head_stride) for v in views}
    if len(strides) != 1:
        raise Unsupported("LMCache objects disagree in row or head stride")
    return next(iter(strides))


def _column(count: int, value: int) -> torch.Tensor:
    return torch.full((count,), value, dtype=torch.int64)


def block_plans(job: BlockCopy) -> list[CopyPlan]:
    """Plans moving whole blocks between the engine and the LMCache objects."""
    geom, objects = job.geom, job.objects
    bs = geom.block_size
    views, columns = [], []
    for obj_index, slots, engine_ids in checks.block_runs(
        job.block_ids, job.blocks_per_object, job.skip, len(objects)
    ):
        view = objects[obj_index]
        assert view is not None  # the kit describes every object that receives a block
        slot_ids = (
            torch.arange(slots.start, slots.stop, dtype=torch.int64)
            if isinstance(slots, slice)
            else slots.to(torch.int64)
        )
        count = slot_ids.numel()
        views.append(view)
        columns.append(
            torch.stack(
                [
                    engine_ids.to("cpu", torch.int64),
                    view.address + slot_ids * (bs * view.row_stride),
                    _column(count, view.kv_stride),
                    _column(count, view.layer_stride),
                ],
                dim=1,
            )
        )
    if not views:
        return []
    row_stride, head_stride = _uniform_strides(views)
    items = torch.cat(columns)
    plans = engine_plans(geom)
    for plan in plans:
        plan.work = items.clone()
        plan.work[:, 0] *= plan.eng_block_stride
        plan.rows = bs
        plan.obj_row_stride, plan.obj_head_stride = row_stride, head_stride
        plan.to_engine = job.to_engine
    return plans


def slot_plans(job: SlotCopy) -> list[CopyPlan]:
    """Plans moving single tokens between engine slots and one LMCache buffer."""
    geom, lmc = job.geom, job.lmcache
    positions, valid = checks.selected_tokens(job.slots, job.skip, 0)
    if valid.numel() == 0:
        return []
    pos = (
        torch.arange(positions.start, positions.stop, dtype=torch.int64)
        if isinstance(positions, slice)
        else positions.to(torch.int64)
    )
    blocks, offsets = valid // geom.block_size, valid % geom.block_size
    count = pos.numel()
    obj_col = lmc.address + pos * lmc.row_stride
    plans = engine_plans(geom)
    for plan in plans:
        engine_col = blocks * plan.eng_block_stride + offsets * plan.eng_row_stride
        plan.work = torch.stack(
            [engine_col, obj_col, _column(count, lmc.kv_stride), _column(count, lmc.layer_stride)],
            dim=1,
        )
        plan.rows = 1
        plan.obj_row_stride, plan.obj_head_stride = lmc.row_stride, lmc.head_stride
        plan.to_engine = job.to_engine
    return plans


class PlanKernels(KVKernels):
    """Block and slot copies as ``kv_copy`` plans; subclasses say how plans execute."""

    def execute(self, plans: Sequence[CopyPlan], device: torch.device) -> None:
        raise NotImplementedError

    def copy_blocks(self, job: BlockCopy) -> None:
        self.execute(block_plans(job), job.geom.device)

    def copy_slots(self, job: SlotCopy) -> None:
        self.execute(slot_plans(job), job.geom.device)
