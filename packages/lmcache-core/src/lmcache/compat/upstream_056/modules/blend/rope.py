"""CacheBlend re-RoPE bookkeeping (upstream 0.5.6's ``modules.blend.rope``): which cos/sin
cache and which part of a cached row each KV group rotates. Pure: no server, no streams.

When CacheBlend reuses a stored chunk at a new position, every cached key must be
re-rotated from the position it was stored at to the one it is served at. Only key planes
rotate, and only a window of each row:

* an ordinary attention group rotates the leading ``head_size`` dims of every head
  (fused K|V layouts pack ``[K | V]`` per head, so a head is ``2 * head_size`` wide and
  only its K half turns);
* an MLA group stores one latent row ``[content | rope]`` per token. Its width alone looks
  like a key-only cache of several heads (GLM's 576 = 9 x 64), so MLA groups must
  *declare* their window ``(offset, width)``; only the trailing window rotates.

The rotation kernel is ``rotary_embedding_k_fused_strided`` of the device ops; an MLA
window is a slice of the latent starting at the window, with the full row as head stride.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from lmcache.v1.platform.kv_formats import format_spec

logger = logging.getLogger(__name__)

__all__ = ["_CBRopeState", "_cb_group_rope_geometry"]

# Rope kernels dispatch on ``at::ScalarType`` codes (c10's enum values). A dtype missing
# here has no native rope; callers fall back to the torch baseline or skip the plan.
_TORCH_TO_AT_SCALAR: dict[torch.dtype, int] = {
    torch.float16: 5,
    torch.float32: 6,
    torch.bfloat16: 15,
}

# vLLM hands fp8 KV over as uint8, which does not say which fp8 encoding the bits are;
# the registration declares it, and this maps the declaration to its ``at::ScalarType``.
_FP8_FLAVOR_TO_AT_SCALAR: dict[str, int] = {
    "fp8_e4m3": 24,  # Float8_e4m3fn
    "fp8_e5m2": 23,  # Float8_e5m2
}


@dataclass
class _CBRopeState:
    """One engine instance's RoPE facts, as its worker registered them.

    Attributes:
        head_size: the model's rotary head size (the legacy window is ``(0, head_size)``).
        is_neox_style: rotate contiguous halves (NeoX) rather than even/odd pairs (GPT-J).
        cos_sin_caches: the distinct cos/sin caches (``[max_pos, rot_dim]``, cosines
            first); models with several rope kinds (local/global theta) have several,
            NoPE models none.
        group_to_cache: engine group -> index into ``cos_sin_caches``; ``-1`` marks a
            rope-less group; empty means every group uses cache 0.
        group_rot: engine group -> rotation window ``(offset, width)`` in elements, or
            None to skip the group. Empty means legacy registration: the window is
            inferred (``(0, head_size)``). MLA models must fill it.
        group_head_size: engine group -> head size, when groups differ; empty = uniform.
        kv_quant: the fp8 encoding of a uint8 KV cache (``"fp8_e4m3"``/``"fp8_e5m2"``),
            or ``""`` when the cache is not quantized.
    """

    head_size: int
    is_neox_style: bool
    cos_sin_caches: list[torch.Tensor]
    group_to_cache: list[int]
    group_rot: list[tuple[int, int] | None] = field(default_factory=list)
    group_head_size: list[int] = field(default_factory=list)
    kv_quant: str = ""

    def _ropeless(self, group: int) -> bool:
        # Checked before anything else so the legacy default window cannot claim the group.
        return 0 <= group < len(self.group_to_cache) and self.group_to_cache[group] < 0

    def head_size_for_group(self, engine_group_idx: int) -> int:
        """The group's head size; the model-wide one without a (covering) per-group map."""
        if 0 <= engine_group_idx < len(self.group_head_size):
            return self.group_head_size[engine_group_idx]
        return self.head_size

    def rot_for_group(
        self, engine_group_idx: int, dtype: torch.dtype | None = None
    ) -> tuple[int, int] | None:
        """The group's rotation window ``(offset, width)``, or None to skip its re-RoPE.

        ``dtype`` is the kernel group's storage dtype. One engine group can hold several
        kernel groups (a bf16 latent beside a uint8 index cache); under a declared map a
        non-float one is skipped, since its rows are not rotatable values. Legacy maps
        keep the inferred window for every dtype.

        Raises:
            RuntimeError: a declared map does not cover ``engine_group_idx``.
        """
        if self._ropeless(engine_group_idx):
            return None
        if not self.group_rot:
            return (0, self.head_size)
        if dtype is not None and not dtype.is_floating_point:
            return None
        if not 0 <= engine_group_idx < len(self.group_rot):
            raise RuntimeError(
                f"CB re-RoPE: engine group {engine_group_idx} has no rope geometry "
                f"(the registered map covers {len(self.group_rot)} groups)"
            )
        return self.group_rot[engine_group_idx]

    def cache_for_group(self, engine_group_idx: int) -> torch.Tensor | None:
        """The group's cos/sin cache, or None when the model or the group has no rope.

        Raises:
            RuntimeError: a non-empty map does not cover ``engine_group_idx``.
        """
        if not self.cos_sin_caches:
            return None
        if not self.group_to_cache:
            return self.cos_sin_caches[0]
        if self._ropeless(engine_group_idx):
            return None
        if not 0 <= engine_group_idx < len(self.group_to_cache):
            raise RuntimeError(
                f"CB re-RoPE: engine group {engine_group_idx} has no rope cache "
                f"(the registered map covers {len(self.group_to_cache)} groups)"
            )
        return self.cos_sin_caches[self.group_to_cache[engine_group_idx]]

    def key_scalar_type(self, dtype: torch.dtype) -> int | None:
        """The ``at::ScalarType`` code a native rope kernel rotates a ``dtype`` key plane
        as: uint8 resolves through ``kv_quant``; None when no native rope applies."""
        if dtype == torch.uint8:
            return _FP8_FLAVOR_TO_AT_SCALAR.get(self.kv_quant)
        return _TORCH_TO_AT_SCALAR.get(dtype)


def _cb_group_rope_geometry(
    group: Any,
    kv_size: int,
    hidden_dim: int,
    head_size: int,
    group_idx: int,
    rot: tuple[int, int] | None = None,
) -> tuple[bool, int, int, int]:
    """How one kernel group's key rows split into rotatable heads.

    ``group`` is the kernel group (read: ``tokens_per_block``/``slots_per_block`` when it
    has them, ``engine_kv_format``, ``shape_desc.hs``); ``hidden_dim`` is the width of one
    token's row in one plane. A declared window with a positive offset is an MLA latent:
    one head as wide as the row, rotated from ``offset``. Otherwise heads are inferred
    from the width: ``head_size`` each, or ``2 * head_size`` for fused K|V layouts.

    Returns:
        ``(fused_packed, per_head, n_heads, rot_offset)``; ``rot_offset`` is 0 except for
        declared MLA windows.

    Raises:
        RuntimeError: a compressed layout (fewer slots than tokens per block), a
            ``kv_size`` other than 1 or 2 (1 for a declared window), a declared window
            that does not end the row, or a width that is not a whole number of heads.
    """
    tokens = getattr(group, "tokens_per_block", None)
    slots = getattr(group, "slots_per_block", tokens)
    if tokens != slots:
        raise RuntimeError(
            f"CB: group {group_idx} is compressed (tokens_per_block={tokens}, "
            f"slots_per_block={slots}); compressed layouts are not supported"
        )
    if rot is not None and rot[0] > 0:
        offset, width = rot
        if kv_size != 1:
            raise RuntimeError(
                f"CB: group {group_idx} declares the MLA rope window {rot} but has "
                f"kv_size={kv_size}; an MLA latent is a single plane (kv_size 1)"
            )
        if offset + width != hidden_dim:
            raise RuntimeError(
                f"CB: group {group_idx}'s rope window {rot} does not end the row "
                f"(hidden_dim={hidden_dim}); an MLA latent is [content | rope]"
            )
        return False, hidden_dim, 1, offset
    if kv_size not in (1, 2):
        raise RuntimeError(
            f"CB: group {group_idx} has kv_size={kv_size}; re-RoPE handles split K/V (2), "
            "fused K|V or key-only (1) and declared MLA windows"
        )
    # The format table says whether heads pack [K | V]; treating such a group as split
    # K/V would rotate the V half of every head. A declared per-head width (shape_desc.hs,
    # 0 when unset) overrides: packed means it is twice the rotary head size.
    fmt = getattr(group, "engine_kv_format", None)
    fused = fmt is not None and format_spec(fmt).fused_packed
    declared_hs = getattr(getattr(group, "shape_desc", None), "hs", None)
    if fused and declared_hs:
        fused = declared_hs == 2 * head_size
    per_head = 2 * head_size if fused else head_size
    n_heads, rest = divmod(hidden_dim, per_head)
    if rest:
        raise RuntimeError(
            f"CB rope: group {group_idx}'s hidden_dim {hidden_dim} is not a whole number "
            f"of {per_head}-wide heads (fused K|V: {fused})"
        )
    return fused, per_head, n_heads, 0
