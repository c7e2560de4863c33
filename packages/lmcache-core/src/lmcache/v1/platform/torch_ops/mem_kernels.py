"""Token-granular KV transfers (slot mappings) and the raw memcpy entry point.

All variants share one path: the engine buffers become canonical views (``_kv_format``), the
LMCache buffer becomes ``[KV, NL, T, NH, HS]``, and each view moves every selected token
with one advanced-indexing op addressed by ``(slot // BS, slot % BS)``. That addressing works
for NHD and HND alike, so unlike upstream's fallback no layout raises NotImplementedError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmcache.v1.platform.ops_types import EngineKVFormat, TransferDirection
from lmcache.v1.platform.torch_ops._tensor_from_ptr import _device_runtime, _host_bytes
from lmcache.v1.platform.torch_ops.plan import (
    PagedLayout,
    as_token_rows,
    canonical_object,
    check_copy_tensor,
    check_memcpy_args,
    check_token_coverage,
    format_spec,
    paged_layout_from_tensors,
    selected_tokens,
    separate_kv_layout,
    single_layer_lmcache_view,
    token_format_spec,
    token_layout,
    validate_direction,
)

__all__ = [
    "lmcache_memcpy_async",
    "load_and_reshape_flash",
    "multi_layer_kv_transfer",
    "multi_layer_kv_transfer_unilateral",
    "reshape_and_cache_back_flash",
    "single_layer_kv_transfer",
    "single_layer_kv_transfer_sgl",
]


# --------------------------------------------------------------------------------------
# The shared token path
# --------------------------------------------------------------------------------------


def _transfer_tokens(
    layout: PagedLayout,
    lmcache_buffer: torch.Tensor,
    slot_mapping: torch.Tensor,
    direction: Any,
    skip: int = 0,
    page_buffer_size: int = 0,
) -> None:
    """Move the tokens of ``lmcache_buffer`` from/to the engine slots of ``slot_mapping``."""
    direction = validate_direction(direction)
    lmc = canonical_object(lmcache_buffer, layout)
    positions, slots = selected_tokens(slot_mapping, skip, page_buffer_size)
    if slots.numel() == 0:
        return
    last = positions.stop - 1 if isinstance(positions, slice) else int(positions.max())
    check_token_coverage(last, lmc.shape[2])
    slots = slots.to(layout.device)
    blocks, offsets = slots // layout.block_size, slots % layout.block_size
    for part in layout.parts:
        region = lmc[part.kv, part.layers][..., part.cols]
        if direction == TransferDirection.D2H:
            gathered = part.view[:, :, blocks, offsets].to(region.device)
            if isinstance(positions, slice):
                region[:, :, positions].copy_(gathered)
            else:
                region.index_copy_(2, positions, gathered)
        else:
            source = (
                region[:, :, positions]
                if isinstance(positions, slice)
                else region.index_select(2, positions)
            )
            part.view[:, :, blocks, offsets] = source.to(part.view.device)


def multi_layer_kv_transfer(
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
    """Slot-mapped copy between ``key_value`` (``[2, NL, T, D]``; MLA ``[1, NL, T, D]``) and
    every layer of the paged cache.

    ``key_value_ptrs`` is an int64 tensor of per-layer host pointers or the engine tensors.
    Tokens before ``skip_prefix_n_tokens`` and slots < 0 are skipped (indices stay aligned).
    Pointer mode rejects non-tight pools (``block_stride_elems``); HND layouts need
    ``block_size`` and ``head_size`` in pointer mode. ``NB_NL_TWO_BS_NH_HS`` given as one
    buffer per layer is read like ``NL_X_TWO_NB_BS_NH_HS``, as upstream does.
    """
    spec = token_format_spec(format_spec(engine_kv_format), key_value_ptrs)
    layout = token_layout(
        key_value_ptrs,
        spec,
        key_value,
        paged_memory_device,
        page_buffer_size,
        block_size,
        head_size,
        block_stride_elems,
    )
    _transfer_tokens(
        layout, key_value, slot_mapping, direction, skip_prefix_n_tokens, page_buffer_size
    )


def multi_layer_kv_transfer_unilateral(
    key_value: torch.Tensor,
    key_value_ptrs: torch.Tensor | list[torch.Tensor],
    slot_mapping: torch.Tensor,
    paged_memory_device: torch.device,
    page_buffer_size: int,
    direction: TransferDirection,
    engine_kv_format: EngineKVFormat,
) -> None:
    """SGLang MHA variant: buffers ``[K_0..K_{NL-1}, V_0..V_{NL-1}]``, each
    ``[page_buffer_size, hidden]`` (or ``[.., NH, HS]``). MLA formats delegate to
    :func:`multi_layer_kv_transfer`.
    """
    spec = format_spec(engine_kv_format)
    if spec.mla:
        multi_layer_kv_transfer(
            key_value,
            key_value_ptrs,
            slot_mapping,
            paged_memory_device,
            page_buffer_size,
            direction,
            engine_kv_format,
        )
        return
    flat_spec = format_spec(EngineKVFormat.TWO_X_NL_X_NBBS_NH_HS)
    if not (isinstance(key_value_ptrs, torch.Tensor) and key_value_ptrs.dim() == 1):
        key_value_ptrs = [as_token_rows(t) for t in key_value_ptrs]
    layout = token_layout(
        key_value_ptrs, flat_spec, key_value, paged_memory_device, page_buffer_size, 1, 0, 0
    )
    _transfer_tokens(layout, key_value, slot_mapping, direction, 0, page_buffer_size)


def single_layer_kv_transfer(
    lmc_key_value_cache: torch.Tensor,
    vllm_key_value_cache: torch.Tensor | Sequence[torch.Tensor],
    slot_mapping: torch.Tensor,
    direction: TransferDirection,
    engine_kv_format: EngineKVFormat,
    token_major: bool = False,
) -> None:
    """One layer: LMCache ``[2, T, NH*HS]`` (``token_major``: ``[T, 2, NH*HS]``; MLA
    ``[T, HS]``) <-> the engine's tensor (or tuple) for that layer in ``engine_kv_format``.
    """
    spec = format_spec(engine_kv_format)
    if spec.container not in ("layers", "layer_tuples"):
        raise ValueError(
            f"{spec.engine_kv_format.name} is not a per-layer format; "
            "use single_layer_kv_transfer_sgl for separate K and V caches"
        )
    layout = paged_layout_from_tensors([vllm_key_value_cache], spec, 1)
    lmc = single_layer_lmcache_view(lmc_key_value_cache, spec.kv_size, token_major)
    _transfer_tokens(layout, lmc, slot_mapping, direction)


def single_layer_kv_transfer_sgl(
    lmc_key_value_cache: torch.Tensor,
    sgl_key_cache: torch.Tensor,
    sgl_value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    direction: TransferDirection,
    token_major: bool = False,
) -> None:
    """One layer against SGLang's separate K and V caches ``[NB, BS, NH, HS]``
    (``[tokens, NH, HS]`` accepted too)."""
    layout = separate_kv_layout(sgl_key_cache, sgl_value_cache)
    lmc = single_layer_lmcache_view(lmc_key_value_cache, 2, token_major)
    _transfer_tokens(layout, lmc, slot_mapping, direction)


def load_and_reshape_flash(
    key_value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layer_idx: int,
) -> None:
    """Extract: engine flash caches ``[NB, BS, NH, HS]`` -> layer ``layer_idx`` of
    ``key_value`` ``[2, NL, T, NH*HS]``."""
    layout = separate_kv_layout(key_cache, value_cache)
    lmc = key_value[:, layer_idx : layer_idx + 1]
    _transfer_tokens(layout, lmc, slot_mapping, TransferDirection.D2H)


def reshape_and_cache_back_flash(
    key_value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    layer_idx: int,
) -> None:
    """Inverse of :func:`load_and_reshape_flash`: scatter layer ``layer_idx`` back."""
    layout = separate_kv_layout(key_cache, value_cache)
    lmc = key_value[:, layer_idx : layer_idx + 1]
    _transfer_tokens(layout, lmc, slot_mapping, TransferDirection.H2D)


# --------------------------------------------------------------------------------------
# Raw memcpy
# --------------------------------------------------------------------------------------

_DEVICE_MEMCPY_SYMBOLS = ("cudaMemcpy", "hipMemcpy")
_MEMCPY_DEFAULT_KIND = 4  # cudaMemcpyDefault == hipMemcpyDefault: direction from the pointers


def _byte_view(buffer: int | torch.Tensor, nbytes: int) -> torch.Tensor:
    if isinstance(buffer, torch.Tensor):
        check_copy_tensor(buffer, nbytes)
        return buffer.reshape(-1).view(torch.uint8)[:nbytes]
    return _host_bytes(int(buffer), nbytes)


def _runtime_memcpy(dest: int, src: int, nbytes: int) -> bool:
    """Synchronous device-runtime memcpy for raw pointers; False when no runtime exists."""
    lib = _device_runtime()
    if lib is None:
        return False
    for symbol in _DEVICE_MEMCPY_SYMBOLS:
        fn = getattr(lib, symbol, None)
        if fn is not None:
            import ctypes

            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            rc = fn(dest, src, nbytes, _MEMCPY_DEFAULT_KIND)
            if rc != 0:
                raise RuntimeError(f"{symbol} failed with error {rc}")
            return True
    return False


def lmcache_memcpy_async(
    dest: int | torch.Tensor,
    src: int | torch.Tensor,
    nbytes: int,
    direction: TransferDirection,
    host_buffer_offset: int,
    host_buffer_alignments: int,
    /,
) -> None:
    """Copy ``nbytes`` from ``src`` to ``dest`` (raw addresses or tensors). Positional only.

    Pointer mode uses the device runtime's synchronous memcpy when one is loaded, otherwise a
    host copy; tensor mode copies byte views (``copy_``, crossing devices as needed). The
    baseline completes the copy before returning (on CPU the "async" copy is synchronous),
    so callers' stream events are trivially satisfied. ``host_buffer_offset`` and
    ``host_buffer_alignments`` only matter to native kernels that split copies at host
    registration boundaries; they are accepted and ignored here.
    """
    check_memcpy_args(direction, nbytes)
    if nbytes == 0:
        return
    both_raw = not isinstance(dest, torch.Tensor) and not isinstance(src, torch.Tensor)
    if both_raw and _runtime_memcpy(int(dest), int(src), nbytes):  # type: ignore[arg-type]
        return
    _byte_view(dest, nbytes).copy_(_byte_view(src, nbytes))
