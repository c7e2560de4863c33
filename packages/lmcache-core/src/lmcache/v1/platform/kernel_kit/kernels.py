"""What a native backend supplies to the kit: reachability checks and copy kernels.

A backend subclasses :class:`KVKernels`; :func:`lmcache.v1.platform.kernel_kit.ops.kv_ops`
wraps it into the ``torch_ops``-compatible ops. Each kernel receives one job record
(:class:`BlockCopy`, :class:`SlotCopy`, :class:`MemcpyCall`) holding the checked arguments
and the geometry; strides and addresses there are in bytes unless a field says elements.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import torch

from lmcache.v1.platform import kv_checks as checks
from lmcache.v1.platform.kv_checks import BlockSummary, SlotSummary, Unsupported
from lmcache.v1.platform.kv_geometry import EngineGeometry, ObjectGeometry
from lmcache.v1.platform.ops_types import TransferDirection

__all__ = ["BlockCopy", "KVKernels", "MemcpyCall", "SlotCopy", "buffer_address"]


class BlockCopy(NamedTuple):
    """Whole blocks: object ``i`` owns ``block_ids[i*bpo:(i+1)*bpo]``; ids before ``skip``
    and negative ids are left out; ``objects[i]`` is None when it receives no block."""

    geom: EngineGeometry
    objects: list[ObjectGeometry | None]
    block_ids: torch.Tensor  # flat int64 host tensor
    skip: int
    blocks_per_object: int
    to_engine: bool


class SlotCopy(NamedTuple):
    """Token ``t`` of ``lmcache`` from/to engine slot ``slots[t]`` for ``t >= skip`` and
    ``slots[t] >= 0`` (flat int64 host tensor, every slot checked in range)."""

    geom: EngineGeometry
    lmcache: ObjectGeometry
    slots: torch.Tensor
    skip: int
    to_engine: bool


class MemcpyCall(NamedTuple):
    """``lmcache_memcpy_async``'s checked arguments (``nbytes > 0``)."""

    dest: int | torch.Tensor
    src: int | torch.Tensor
    nbytes: int
    direction: TransferDirection
    host_buffer_offset: int
    host_buffer_alignments: int


class KVKernels:
    """What a backend supplies: reachability checks and the kernels that execute copies.

    Override :meth:`copy_blocks`, :meth:`copy_slots` and/or :meth:`memcpy`; an op whose
    kernel is not overridden is not exported, so it keeps the baseline. The check hooks
    raise :class:`Unsupported` for memory the kernels cannot reach. Strides and addresses
    handed to the kernels are in bytes unless a field says elements.
    """

    # True: a non-contiguous LMCache object, LMCache row or engine head raises ValueError
    # naming the argument; False: such inputs go to the torch baseline.
    strict_layout: ClassVar[bool] = False

    def check_device(self, device: torch.device) -> None:
        """The block op's ``device`` argument names a device the kernels run on."""

    def check_engine_tensor(self, tensor: torch.Tensor, arg: str) -> None:
        """An engine buffer tensor lives where the kernels can reach it."""

    def check_lmcache_tensor(self, tensor: torch.Tensor, arg: str) -> None:
        """An LMCache buffer tensor lives where the kernels can reach it (see also
        :meth:`kernel_address`)."""

    def check_engine_pointers(self, pointers: Sequence[int], device: torch.device) -> None:
        """Raw engine buffer addresses are memory the kernels can reach."""

    def kernel_address(self, address: int) -> int:
        """The address the kernels use for LMCache memory at ``address`` (0: unreachable)."""
        return address

    def block_summary(self, block_ids: torch.Tensor, skip: int, bpo: int) -> BlockSummary:
        return checks.block_summary(block_ids, skip, bpo)

    def slot_summary(self, slots: torch.Tensor, skip: int) -> SlotSummary:
        return checks.slot_summary(slots, skip)

    def copy_blocks(self, job: BlockCopy) -> None:
        """Move the whole blocks ``job`` describes (every check has passed)."""
        raise Unsupported("no block kernel")

    def copy_slots(self, job: SlotCopy) -> None:
        """Move the single tokens ``job`` describes (every check has passed)."""
        raise Unsupported("no slot kernel")

    def memcpy(self, job: MemcpyCall) -> None:
        """Copy ``job.nbytes > 0`` bytes (arguments checked; see :func:`buffer_address`)."""
        raise Unsupported("no memcpy kernel")

    def implements(self, method: str) -> bool:
        return getattr(type(self), method) is not getattr(KVKernels, method)


def buffer_address(buffer: int | torch.Tensor, nbytes: int, arg: str) -> int:
    """The address of a memcpy side; a tensor must be contiguous and hold ``nbytes``."""
    if not isinstance(buffer, torch.Tensor):
        return int(buffer)
    checks.check_copy_tensor(buffer, nbytes, arg)
    return buffer.data_ptr()
