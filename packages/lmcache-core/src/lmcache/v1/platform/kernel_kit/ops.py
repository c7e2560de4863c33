"""Each KV op declared once: checks, geometry and fallback around a backend's kernels.

The ``torch_ops`` function is each op's declaration (name, signature, documentation); a
backend implements :class:`~.kernels.KVKernels` and :func:`kv_ops` returns, for every op
those kernels implement, a callable with the baseline's exact name and signature, ready for
``DeviceOps.bind_native``. The callable:

1. binds the caller's arguments against the baseline's signature;
2. runs the baseline's argument checks (:mod:`.checks`: same order, types and messages);
3. turns engine and LMCache buffers into view-free geometry (:mod:`.geometry`);
4. calls the kernel with one job record only after every check has passed;
5. on :class:`~.checks.Unsupported` -- an input the kernels do not model -- calls the
   baseline with the caller's original arguments, before anything is written.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from lmcache.v1.platform import kv_checks as checks
from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.kernel_kit.kernels import BlockCopy, KVKernels, MemcpyCall, SlotCopy
from lmcache.v1.platform.kv_checks import Unsupported
from lmcache.v1.platform.kv_formats import KVFormatSpec, format_spec
from lmcache.v1.platform.kv_geometry import (
    EngineGeometry,
    ObjectGeometry,
    geometry_from_bufs,
    geometry_from_tensors,
    pointer_object_geometry,
    tensor_buf,
)
from lmcache.v1.platform.kv_pointers import geometry_from_pointers
from lmcache.v1.platform.ops_types import EngineKVFormat, PageBufferShapeDesc, TransferDirection
from lmcache.v1.platform.torch_ops import plan

__all__ = ["KV_OP_NAMES", "KVOps", "kv_ops"]

Args = dict[str, Any]

# Which kernel each op needs; an op whose kernel the backend lacks is not exported.
_KERNEL_OF = {
    "multi_layer_block_kv_transfer": "copy_blocks",
    "multi_layer_kv_transfer": "copy_slots",
    "multi_layer_kv_transfer_unilateral": "copy_slots",
    "single_layer_kv_transfer": "copy_slots",
    "single_layer_kv_transfer_sgl": "copy_slots",
    "load_and_reshape_flash": "copy_slots",
    "reshape_and_cache_back_flash": "copy_slots",
    "lmcache_memcpy_async": "memcpy",
}
KV_OP_NAMES: tuple[str, ...] = tuple(_KERNEL_OF)


class KVOps:
    """The KV ops of one backend: ``op(name)`` has the ``torch_ops`` signature of ``name``."""

    def __init__(self, kernels: KVKernels) -> None:
        self.kernels = kernels
        # Looked up per call, so a test can swap it to prove that no input falls back.
        self.baseline: Any = torch_ops

    def op(self, name: str) -> Callable[..., Any]:
        """The native op ``name``: the baseline's signature, this backend's kernels."""
        declaration = getattr(torch_ops, name)
        signature = inspect.signature(declaration)
        body: Callable[[Args], None] = getattr(self, f"_{name}")

        names = list(signature.parameters)
        params = signature.parameters.values()
        defaults = {p.name: p.default for p in params if p.default is not p.empty}

        @functools.wraps(declaration)
        def native_op(*args: Any, **kwargs: Any) -> None:
            missing = names[len(args) :]
            if kwargs or len(args) > len(names) or any(n not in defaults for n in missing):
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                arguments: Args = bound.arguments
            else:  # positional arguments plus defaults: the hot path skips bind()
                arguments = dict(zip(names, args))
                arguments.update((name, defaults[name]) for name in missing)
            try:
                body(arguments)
            except Unsupported:
                getattr(self.baseline, name)(*args, **kwargs)

        native_op.__module__ = __name__
        native_op.__doc__ = f"Native ``{name}`` over {type(self.kernels).__name__}; " + (
            "semantics (errors included) of the torch baseline."
        )
        native_op.kv_ops = self  # type: ignore[attr-defined]
        return native_op

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
        self.kernels.copy_slots(SlotCopy(geom, lmc, slots, skip, to_engine))

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

    def _separate_kv(self, a: Args, key_arg: str, value_arg: str) -> EngineGeometry:
        key_cache, value_cache = a[key_arg], a[value_arg]
        self._engine_tensor(key_cache, key_arg)
        self._engine_tensor(value_cache, value_arg)
        items = [(tensor_buf(key_cache), 0, 0, 0), (tensor_buf(value_cache), 1, 0, 0)]
        spec = plan.separate_kv_spec(key_cache)
        geom = geometry_from_bufs(items, spec, 1, f"{key_arg}/{value_arg}")
        self._check_heads(geom)
        return geom

    def _flash_layer(self, a: Args, direction: TransferDirection) -> None:
        geom = self._separate_kv(a, "key_cache", "value_cache")
        key_value, layer = a["key_value"], a["layer_idx"]
        if not isinstance(key_value, torch.Tensor):
            raise Unsupported("key_value is not a tensor")
        lmc = key_value[:, layer : layer + 1]
        self._tokens(geom, lmc, "key_value", a["slot_mapping"], direction)

    # -- the ops, bodies over the bound arguments ----------------------------------------
    def _multi_layer_block_kv_transfer(self, a: Args) -> None:
        args = checks.block_transfer_args(
            a["lmcache_objects_ptrs"],
            a["block_ids"],
            a["direction"],
            a["shape_desc"],
            a["lmcache_chunk_size"],
            a["engine_kv_format"],
            a["skip_prefix_n_blocks"],
        )
        bpo, ids, objects = args.blocks_per_object, args.block_ids, args.objects
        checks.check_block_capacity(ids.numel(), bpo, len(objects))
        self.kernels.check_device(torch.device(a["device"]))
        summary = self.kernels.block_summary(ids, args.skip, bpo)
        if summary.valid_count == 0:
            return
        root = "paged_buffer_ptrs_tensor"
        desc: PageBufferShapeDesc = a["shape_desc"]
        geom = self._engine(a[root], args.spec, desc, a["device"], root)
        checks.check_engine_block_size(geom.block_size, desc)
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
        self.kernels.copy_blocks(BlockCopy(geom, views, ids, args.skip, bpo, to_engine))

    def _multi_layer_kv_transfer(self, a: Args) -> None:
        spec = checks.token_format_spec(format_spec(a["engine_kv_format"]), a["key_value_ptrs"])
        geom = self._token_engine(
            a["key_value_ptrs"],
            spec,
            a["key_value"],
            a["paged_memory_device"],
            a["page_buffer_size"],
            a["block_size"],
            a["head_size"],
            a["block_stride_elems"],
        )
        skip, size = int(a["skip_prefix_n_tokens"]), int(a["page_buffer_size"])
        self._tokens(
            geom, a["key_value"], "key_value", a["slot_mapping"], a["direction"], skip, size
        )

    def _multi_layer_kv_transfer_unilateral(self, a: Args) -> None:
        if format_spec(a["engine_kv_format"]).mla:
            # The baseline's MLA delegation: multi_layer_kv_transfer with its defaults.
            defaults = ("block_size", "head_size", "skip_prefix_n_tokens", "block_stride_elems")
            self._multi_layer_kv_transfer({**a, **dict.fromkeys(defaults, 0)})
            return
        flat = format_spec(EngineKVFormat.TWO_X_NL_X_NBBS_NH_HS)
        paged = a["key_value_ptrs"]
        if not (isinstance(paged, torch.Tensor) and paged.dim() == 1):
            paged = [plan.as_token_rows(t) for t in paged]
        size = int(a["page_buffer_size"])
        geom = self._token_engine(
            paged, flat, a["key_value"], a["paged_memory_device"], size, 1, 0, 0
        )
        self._tokens(geom, a["key_value"], "key_value", a["slot_mapping"], a["direction"], 0, size)

    def _single_layer_kv_transfer(self, a: Args) -> None:
        spec = format_spec(a["engine_kv_format"])
        if spec.container not in ("layers", "layer_tuples"):
            raise Unsupported("not a per-layer format")
        lmc = a["lmc_key_value_cache"]
        if not isinstance(lmc, torch.Tensor):
            raise Unsupported("lmc_key_value_cache is not a tensor")
        root = "vllm_key_value_cache"
        geom = geometry_from_tensors([a[root]], spec, 1, root, self._engine_tensor)
        self._check_heads(geom)
        lmc = plan.single_layer_lmcache_view(lmc, spec.kv_size, a["token_major"])
        self._tokens(geom, lmc, "lmc_key_value_cache", a["slot_mapping"], a["direction"])

    def _single_layer_kv_transfer_sgl(self, a: Args) -> None:
        geom = self._separate_kv(a, "sgl_key_cache", "sgl_value_cache")
        lmc = a["lmc_key_value_cache"]
        if not isinstance(lmc, torch.Tensor):
            raise Unsupported("lmc_key_value_cache is not a tensor")
        lmc = plan.single_layer_lmcache_view(lmc, 2, a["token_major"])
        self._tokens(geom, lmc, "lmc_key_value_cache", a["slot_mapping"], a["direction"])

    def _load_and_reshape_flash(self, a: Args) -> None:
        self._flash_layer(a, TransferDirection.D2H)

    def _reshape_and_cache_back_flash(self, a: Args) -> None:
        self._flash_layer(a, TransferDirection.H2D)

    def _lmcache_memcpy_async(self, a: Args) -> None:
        nbytes = a["nbytes"]
        direction = checks.check_memcpy_args(a["direction"], nbytes)
        if nbytes == 0:
            return
        self.kernels.memcpy(
            MemcpyCall(
                a["dest"],
                a["src"],
                int(nbytes),
                direction,
                int(a["host_buffer_offset"]),
                int(a["host_buffer_alignments"]),
            )
        )


def kv_ops(kernels: KVKernels) -> dict[str, Callable[..., Any]]:
    """The ops ``kernels`` can execute, by ``torch_ops`` name, for a native ops module."""
    ops = KVOps(kernels)
    return {name: ops.op(name) for name, kernel in _KERNEL_OF.items() if kernels.implements(kernel)}
