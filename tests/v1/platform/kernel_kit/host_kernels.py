"""A pure-Python ``KVKernels``: executes the kit's job records with ``ctypes.memmove``.

It reads nothing but the geometry the kit hands over (addresses and byte strides), so the
kit's ops over it equal the torch baseline exactly when that geometry is right.
"""

from __future__ import annotations

import ctypes

from lmcache.v1.platform.kernel_kit import checks
from lmcache.v1.platform.kernel_kit.geometry import EngineGeometry, ObjectGeometry, PlaneGroup
from lmcache.v1.platform.kernel_kit.kernels import BlockCopy, KVKernels, SlotCopy


def _move(geom: EngineGeometry, group: PlaneGroup, engine: int, obj: int, to_engine: bool) -> None:
    es = geom.itemsize
    for h in range(geom.num_heads):
        e = engine + h * group.head_stride * es
        o = obj + h * geom.head_width * es
        src, dst = (o, e) if to_engine else (e, o)
        ctypes.memmove(dst, src, group.width * es)


def _plane(group: PlaneGroup, i: int, lmc: ObjectGeometry, es: int) -> tuple[int, int]:
    return group.bases[i], lmc.plane_address(group.kv[i], group.layers[i], group.cols[i] * es)


class HostKernels(KVKernels):
    def copy_blocks(self, job: BlockCopy) -> None:
        geom, es, bs = job.geom, job.geom.itemsize, job.geom.block_size
        runs = checks.block_runs(job.block_ids, job.blocks_per_object, job.skip, len(job.objects))
        for obj_index, slots, engine_ids in runs:
            obj = job.objects[obj_index]
            assert obj is not None
            slot_list = (
                list(range(slots.start, slots.stop)) if isinstance(slots, slice) else slots.tolist()
            )
            for slot, block in zip(slot_list, engine_ids.tolist()):
                for group in geom.groups:
                    for i in range(len(group.bases)):
                        base, plane = _plane(group, i, obj, es)
                        for row in range(bs):
                            engine = (
                                base + (block * group.block_stride + row * group.tok_stride) * es
                            )
                            lmc = plane + (slot * bs + row) * obj.row_stride
                            _move(geom, group, engine, lmc, job.to_engine)

    def copy_slots(self, job: SlotCopy) -> None:
        geom, es = job.geom, job.geom.itemsize
        positions, valid = checks.selected_tokens(job.slots, job.skip, 0)
        pos = (
            list(range(positions.start, positions.stop))
            if isinstance(positions, slice)
            else positions.tolist()
        )
        for position, slot in zip(pos, valid.tolist()):
            block, row = divmod(slot, geom.block_size)
            for group in geom.groups:
                for i in range(len(group.bases)):
                    base, plane = _plane(group, i, job.lmcache, es)
                    engine = base + (block * group.block_stride + row * group.tok_stride) * es
                    lmc = plane + position * job.lmcache.row_stride
                    _move(geom, group, engine, lmc, job.to_engine)
