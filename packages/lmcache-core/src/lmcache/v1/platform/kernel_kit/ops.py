"""Each KV op declared once: signature, checks, geometry and fallback around a backend's kernels.

A native backend implements :class:`KVKernels` -- where its kernels can reach memory and how
they execute a copy described by :mod:`.geometry` -- and hands an instance to
:func:`kv_ops`. That returns, for every op the kernels implement, a callable with the exact
``torch_ops`` name and signature, ready for ``DeviceOps.bind_native``. The callable:

1. runs the baseline's argument checks (:mod:`.checks`: same order, types and messages);
2. turns engine and LMCache buffers into view-free geometry;
3. calls the kernel only after every check has passed;
4. on :class:`~.checks.Unsupported` -- an input the kernels do not model -- calls the
   ``torch_ops`` function with the caller's original arguments, before anything is written.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import torch

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.kernel_kit import checks
from lmcache.v1.platform.kernel_kit.checks import BlockSummary, SlotSummary, Unsupported
from lmcache.v1.platform.kernel_kit.geometry import (
    EngineGeometry,
    ObjectGeometry,
    geometry_from_bufs,
    geometry_from_pointers,
    geometry_from_tensors,
    pointer_object_geometry,
    tensor_buf,
)
from lmcache.v1.platform.kv_formats import KVFormatSpec, format_spec
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc, TransferDirection
from lmcache.v1.platform.torch_ops import plan

__all__ = ["KV_OP_NAMES", "KVKernels", "KVOps", "kv_ops"]

_Op = TypeVar("_Op", bound=Callable[..., Any])

BLOCK_OPS = ("multi_layer_block_kv_transfer",)
SLOT_OPS = (
    "load_and_reshape_flash",
    "multi_layer_kv_transfer",
    "multi_layer_kv_transfer_unilateral",
    "reshape_and_cache_back_flash",
    "single_layer_kv_transfer",
    "single_layer_kv_transfer_sgl",
)
MEMCPY_OPS = ("lmcache_memcpy_async",)
KV_OP_NAMES: tuple[str, ...] = BLOCK_OPS + SLOT_OPS + MEMCPY_OPS


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

    def copy_blocks(
        self,
        geom: EngineGeometry,
        objects: list[ObjectGeometry | None],
        block_ids: torch.Tensor,
        skip: int,
        blocks_per_object: int,
        to_engine: bool,
    ) -> None:
        """Move whole blocks: object ``i`` owns ``block_ids[i*bpo:(i+1)*bpo]``; ids before
        ``skip`` and negative ids are left out; ``objects[i]`` is None when it gets none."""
        raise Unsupported("no block kernel")

    def copy_slots(
        self,
        geom: EngineGeometry,
        lmcache: ObjectGeometry,
        slots: torch.Tensor,
        skip: int,
        to_engine: bool,
    ) -> None:
        """Move token ``t`` of ``lmcache`` from/to engine slot ``slots[t]`` for ``t >= skip``
        and ``slots[t] >= 0`` (flat int64 host tensor, every slot checked in range)."""
        raise Unsupported("no slot kernel")

    def memcpy(
        self,
        dest: int | torch.Tensor,
        src: int | torch.Tensor,
        nbytes: int,
        direction: TransferDirection,
        host_buffer_offset: int,
        host_buffer_alignments: int,
    ) -> None:
        """Copy ``nbytes > 0`` bytes (arguments checked; see :func:`buffer_address`)."""
        raise Unsupported("no memcpy kernel")

    def implements(self, method: str) -> bool:
        return getattr(type(self), method) is not getattr(KVKernels, method)


def buffer_address(buffer: int | torch.Tensor, nbytes: int, arg: str) -> int:
    """The address of a memcpy side; a tensor must be contiguous and hold ``nbytes``."""
    if not isinstance(buffer, torch.Tensor):
        return int(buffer)
    checks.check_copy_tensor(buffer, nbytes, arg)
    return buffer.data_ptr()


def _falls_back(op: _Op) -> _Op:
    """Run the baseline op of the same name when the kernels decline the input."""
    name = op.__name__

    @functools.wraps(op)
    def run(self: KVOps, *args: Any, **kwargs: Any) -> Any:
        try:
            return op(self, *args, **kwargs)
        except Unsupported:
            return getattr(self.baseline, name)(*args, **kwargs)

    return run  # type: ignore[return-value]


class KVOps:
    """The KV ops of one backend, each with the exact ``torch_ops`` signature."""

    def __init__(self, kernels: KVKernels) -> None:
        self.kernels = kernels
        # Looked up per call, so a test can swap it to prove that no input falls back.
        self.baseline: Any = torch_ops

    # -- shared steps -------------------------------------------------------------------
    def _engine_tensor(self, tensor: Any, arg: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise Unsupported(f"{arg} is not a tensor")
        self.kernels.check_engine_tensor(tensor, arg)

    def _lmcache_tensor(self, tensor: Any, arg: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise Unsupported(f"{arg} is not a tensor")
        self.kernels.check_lmcache_tensor(tensor, arg)

    def _layout_problem(self, message: str) -> Exception:
        return ValueError(message) if self.kernels.strict_layout else Unsupported(message)

    def _check_heads(self, geom: EngineGeometry) -> None:
        if geom.strided_head_arg:
            raise self._layout_problem(
                f"{geom.strided_head_arg}: the head dimension of the engine buffer must be "
                "contiguous; pass a contiguous tensor or a view with unit head stride"
            )

    def _engine(
        self, paged: Any, spec: KVFormatSpec, desc: PageBufferShapeDesc, device: Any, root: str
    ) -> EngineGeometry:
        if checks.is_pointer_tensor(paged):
            pointers = checks.pointer_list(paged)
            self.kernels.check_engine_pointers(pointers, torch.device(device))
            geom = geometry_from_pointers(pointers, spec, desc, device, root)
        else:
            geom = geometry_from_tensors(paged, spec, int(desc.bs), root, self._engine_tensor)
        self._check_heads(geom)
        return geom

    def _lmcache(self, buffer: Any, geom: EngineGeometry, arg: str) -> ObjectGeometry:
        """An LMCache tensor as ``[KV, NL, T, NH, HW]`` geometry."""
        self._lmcache_tensor(buffer, arg)
        if buffer.element_size() != geom.itemsize:
            raise Unsupported(f"{arg} reinterprets its dtype")
        if buffer.dim() == 4 and buffer.shape[0] != geom.kv_size:
            raise Unsupported(f"{arg} has {buffer.shape[0]} KV planes")
        if buffer.numel() == 0:
            raise Unsupported(f"{arg} is empty")
        try:
            canon = buffer.view(geom.dtype).view(
                geom.kv_size, geom.num_layers, -1, geom.num_heads, geom.head_width
            )
        except RuntimeError as exc:
            raise Unsupported(str(exc)) from None
        s_kv, s_layer, s_row, s_head, s_col = canon.stride()
        if geom.head_width > 1 and s_col != 1:
            raise self._layout_problem(f"{arg} must be contiguous in its last (hidden) dimension")
        address = self.kernels.kernel_address(canon.data_ptr())
        if address == 0:
            raise Unsupported(f"{arg} is not visible to the kernels")
        es = geom.itemsize
        return ObjectGeometry(
            address, s_kv * es, s_layer * es, s_row * es, s_head * es, int(canon.shape[2])
        )

    def _object(self, obj: Any, index: int, geom: EngineGeometry, chunk: int) -> ObjectGeometry:
        if not isinstance(obj, torch.Tensor):
            address = self.kernels.kernel_address(int(obj))
            if address == 0:
                raise Unsupported("LMCache object address is not visible to the kernels")
            return pointer_object_geometry(address, geom, chunk)
        arg = f"lmcache_objects_ptrs[{index}]"
        self._lmcache_tensor(obj, arg)
        if self.kernels.strict_layout and not obj.is_contiguous():
            raise ValueError(f"{arg} must be a contiguous tensor (got strides {obj.stride()})")
        return self._lmcache(obj, geom, arg)

    def _tokens(
        self,
        geom: EngineGeometry,
        lmcache_buffer: Any,
        arg: str,
        slot_mapping: Any,
        direction: Any,
        skip: int = 0,
        page_buffer_size: int = 0,
    ) -> None:
        to_engine = checks.validate_direction(direction) == TransferDirection.H2D
        lmc = self._lmcache(lmcache_buffer, geom, arg)
        checks.check_skip_tokens(skip)
        slots = checks.as_int64_cpu(slot_mapping)
        summary = self.kernels.slot_summary(slots, skip)
        if summary.highest is None:
            return
        checks.check_slot_range(summary.highest, page_buffer_size)
        if summary.valid_count == 0:
            return
        checks.check_token_coverage(summary.last, lmc.tokens)
        checks.check_engine_slot_range(summary.highest, geom.num_blocks * geom.block_size)
        self.kernels.copy_slots(geom, lmc, slots, skip, to_engine)

    def _token_engine(
        self,
        paged: Any,
        spec: KVFormatSpec,
        key_value: Any,
        device: Any,
        page_buffer_size: int,
        block_size: int,
        head_size: int,
        block_stride_elems: int,
    ) -> EngineGeometry:
        root = "key_value_ptrs"
        if not (isinstance(paged, torch.Tensor) and paged.dim() == 1):
            geom = geometry_from_tensors(
                paged, spec, block_size if block_size > 0 else 1, root, self._engine_tensor
            )
            self._check_heads(geom)
            return geom
        if not checks.is_pointer_tensor(paged) or not isinstance(key_value, torch.Tensor):
            raise Unsupported("pointer mode the baseline reinterprets")
        desc = checks.token_pointer_shape_desc(
            spec, key_value, page_buffer_size, block_size, head_size, block_stride_elems
        )
        if desc.bs <= 0 or desc.hs <= 0:
            raise Unsupported("degenerate pointer-mode geometry")
        return self._engine(paged, spec, desc, device, root)

    def _separate_kv(
        self, key_cache: Any, value_cache: Any, key_arg: str, value_arg: str
    ) -> EngineGeometry:
        self._engine_tensor(key_cache, key_arg)
        self._engine_tensor(value_cache, value_arg)
        items = [(tensor_buf(key_cache), 0, 0, 0), (tensor_buf(value_cache), 1, 0, 0)]
        spec = plan.separate_kv_spec(key_cache)
        geom = geometry_from_bufs(items, spec, 1, f"{key_arg}/{value_arg}")
        self._check_heads(geom)
        return geom

    def _flash_layer(
        self,
        key_value: Any,
        key_cache: Any,
        value_cache: Any,
        slot_mapping: Any,
        layer_idx: int,
        direction: TransferDirection,
    ) -> None:
        geom = self._separate_kv(key_cache, value_cache, "key_cache", "value_cache")
        if not isinstance(key_value, torch.Tensor):
            raise Unsupported("key_value is not a tensor")
        lmc = key_value[:, layer_idx : layer_idx + 1]
        self._tokens(geom, lmc, "key_value", slot_mapping, direction)

    # -- block-granular -----------------------------------------------------------------
    @_falls_back
    def multi_layer_block_kv_transfer(
        self,
        paged_buffer_ptrs_tensor: torch.Tensor | list,
        lmcache_objects_ptrs: list[int] | list[torch.Tensor],
        block_ids: torch.Tensor | list[int],
        device: torch.device | str,
        direction: TransferDirection,
        shape_desc: PageBufferShapeDesc,
        lmcache_chunk_size: int,
        engine_kv_format: EngineKVFormat,
        skip_prefix_n_blocks: int,
    ) -> None:
        """Native ``multi_layer_block_kv_transfer``; semantics of the torch baseline."""
        args = checks.block_transfer_args(
            lmcache_objects_ptrs,
            block_ids,
            direction,
            shape_desc,
            lmcache_chunk_size,
            engine_kv_format,
            skip_prefix_n_blocks,
        )
        bpo, ids, objects = args.blocks_per_object, args.block_ids, args.objects
        checks.check_block_capacity(ids.numel(), bpo, len(objects))
        self.kernels.check_device(torch.device(device))
        summary = self.kernels.block_summary(ids, args.skip, bpo)
        if summary.valid_count == 0:
            return
        root = "paged_buffer_ptrs_tensor"
        geom = self._engine(paged_buffer_ptrs_tensor, args.spec, shape_desc, device, root)
        checks.check_engine_block_size(geom.block_size, shape_desc)
        checks.check_block_id_range(summary.highest, geom.num_blocks)
        views: list[ObjectGeometry | None] = []
        for index, last_slot in enumerate(summary.last_slots):
            if last_slot < 0:  # receives no block (skipped or all padding)
                views.append(None)
                continue
            view = self._object(objects[index], index, geom, args.chunk_size)
            checks.check_block_slot(index, last_slot, view.tokens // geom.block_size, ValueError)
            views.append(view)
        to_engine = args.direction == TransferDirection.H2D
        self.kernels.copy_blocks(geom, views, ids, args.skip, bpo, to_engine)

    # -- slot-mapped --------------------------------------------------------------------
    @_falls_back
    def multi_layer_kv_transfer(
        self,
        key_value: torch.Tensor,
        key_value_ptrs: torch.Tensor | list[torch.Tensor],
        slot_mapping: torch.Tensor,
        paged_memory_device: torch.device,
        page_buffer_size: int,
        direction: TransferDirection,
        engine_kv_format: EngineKVFormat,
        block_size: int = 0,
        head_size: int = 0,
        skip_prefix_n_tokens: int = 0,
        block_stride_elems: int = 0,
    ) -> None:
        """Native ``multi_layer_kv_transfer``; semantics of the torch baseline."""
        spec = format_spec(engine_kv_format)
        geom = self._token_engine(
            key_value_ptrs,
            spec,
            key_value,
            paged_memory_device,
            page_buffer_size,
            block_size,
            head_size,
            block_stride_elems,
        )
        self._tokens(
            geom,
            key_value,
            "key_value",
            slot_mapping,
            direction,
            int(skip_prefix_n_tokens),
            int(page_buffer_size),
        )

    @_falls_back
    def multi_layer_kv_transfer_unilateral(
        self,
        key_value: torch.Tensor,
        key_value_ptrs: torch.Tensor | list[torch.Tensor],
        slot_mapping: torch.Tensor,
        paged_memory_device: torch.device,
        page_buffer_size: int,
        direction: TransferDirection,
        engine_kv_format: EngineKVFormat,
    ) -> None:
        """Native ``multi_layer_kv_transfer_unilateral`` (SGLang K list then V list)."""
        if format_spec(engine_kv_format).mla:
            self.multi_layer_kv_transfer(
                key_value,
                key_value_ptrs,
                slot_mapping,
                paged_memory_device,
                page_buffer_size,
                direction,
                engine_kv_format,
            )
            return
        flat = format_spec(EngineKVFormat.TWO_X_NL_X_NBBS_NH_HS)
        paged: Any = key_value_ptrs
        if not (isinstance(paged, torch.Tensor) and paged.dim() == 1):
            paged = [plan.as_token_rows(t) for t in paged]
        geom = self._token_engine(
            paged, flat, key_value, paged_memory_device, page_buffer_size, 1, 0, 0
        )
        self._tokens(
            geom, key_value, "key_value", slot_mapping, direction, 0, int(page_buffer_size)
        )

    @_falls_back
    def single_layer_kv_transfer(
        self,
        lmc_key_value_cache: torch.Tensor,
        vllm_key_value_cache: Any,
        slot_mapping: torch.Tensor,
        direction: TransferDirection,
        engine_kv_format: EngineKVFormat,
        token_major: bool = False,
    ) -> None:
        """Native ``single_layer_kv_transfer``; semantics of the torch baseline."""
        spec = format_spec(engine_kv_format)
        if spec.container not in ("layers", "layer_tuples"):
            raise Unsupported("not a per-layer format")
        if not isinstance(lmc_key_value_cache, torch.Tensor):
            raise Unsupported("lmc_key_value_cache is not a tensor")
        root = "vllm_key_value_cache"
        geom = geometry_from_tensors([vllm_key_value_cache], spec, 1, root, self._engine_tensor)
        self._check_heads(geom)
        lmc = plan.single_layer_lmcache_view(lmc_key_value_cache, spec.kv_size, token_major)
        self._tokens(geom, lmc, "lmc_key_value_cache", slot_mapping, direction)

    @_falls_back
    def single_layer_kv_transfer_sgl(
        self,
        lmc_key_value_cache: torch.Tensor,
        sgl_key_cache: torch.Tensor,
        sgl_value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        direction: TransferDirection,
        token_major: bool = False,
    ) -> None:
        """Native ``single_layer_kv_transfer_sgl`` (separate K and V caches)."""
        geom = self._separate_kv(sgl_key_cache, sgl_value_cache, "sgl_key_cache", "sgl_value_cache")
        if not isinstance(lmc_key_value_cache, torch.Tensor):
            raise Unsupported("lmc_key_value_cache is not a tensor")
        lmc = plan.single_layer_lmcache_view(lmc_key_value_cache, 2, token_major)
        self._tokens(geom, lmc, "lmc_key_value_cache", slot_mapping, direction)

    @_falls_back
    def load_and_reshape_flash(
        self,
        key_value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        layer_idx: int,
    ) -> None:
        """Native ``load_and_reshape_flash`` (engine flash caches -> one layer of key_value)."""
        d2h = TransferDirection.D2H
        self._flash_layer(key_value, key_cache, value_cache, slot_mapping, layer_idx, d2h)

    @_falls_back
    def reshape_and_cache_back_flash(
        self,
        key_value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        layer_idx: int,
    ) -> None:
        """Native ``reshape_and_cache_back_flash`` (one layer of key_value -> flash caches)."""
        h2d = TransferDirection.H2D
        self._flash_layer(key_value, key_cache, value_cache, slot_mapping, layer_idx, h2d)

    # -- raw copies ---------------------------------------------------------------------
    @_falls_back
    def lmcache_memcpy_async(
        self,
        dest: int | torch.Tensor,
        src: int | torch.Tensor,
        nbytes: int,
        direction: TransferDirection,
        host_buffer_offset: int,
        host_buffer_alignments: int,
        /,
    ) -> None:
        """Native ``lmcache_memcpy_async``; positional only, like the upstream binding."""
        checked = checks.check_memcpy_args(direction, nbytes)
        if nbytes == 0:
            return
        self.kernels.memcpy(
            dest, src, int(nbytes), checked, int(host_buffer_offset), int(host_buffer_alignments)
        )


_KERNEL_OF = {
    **dict.fromkeys(BLOCK_OPS, "copy_blocks"),
    **dict.fromkeys(SLOT_OPS, "copy_slots"),
    **dict.fromkeys(MEMCPY_OPS, "memcpy"),
}


def kv_ops(kernels: KVKernels) -> dict[str, Callable[..., Any]]:
    """The ops ``kernels`` can execute, by ``torch_ops`` name, for a native ops module."""
    ops = KVOps(kernels)
    return {
        name: getattr(ops, name) for name in KV_OP_NAMES if kernels.implements(_KERNEL_OF[name])
    }
