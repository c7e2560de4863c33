"""RoPE re-positioning of cached keys (CacheBlend): undo the old rotation, apply the new.

``cos_sin_cache`` is ``[max_position, rot_dim]`` with the cosines in the first half and the
sines in the second (vLLM's convention). Only the first ``rot_dim`` elements of each head
rotate. Rotating by ``-old`` then ``+new`` is one rotation by ``new - old``, computed in
float32 and written back in the key's dtype.
"""

from __future__ import annotations

import torch

__all__ = ["rotary_embedding_k_fused", "rotary_embedding_k_fused_strided"]


def _delta_cos_sin(
    old_positions: torch.Tensor, new_positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``theta(new) - theta(old)`` per token, shape ``[T, 1, rot_dim/2]``."""
    half = cos_sin_cache.shape[-1] // 2
    old = cos_sin_cache.index_select(0, old_positions.reshape(-1).long()).float()
    new = cos_sin_cache.index_select(0, new_positions.reshape(-1).long()).float()
    cos_old, sin_old = old[:, :half], old[:, half:]
    cos_new, sin_new = new[:, :half], new[:, half:]
    cos = cos_new * cos_old + sin_new * sin_old
    sin = sin_new * cos_old - cos_new * sin_old
    return cos.unsqueeze(1), sin.unsqueeze(1)


def _rotate_heads(
    heads: torch.Tensor,
    old_positions: torch.Tensor,
    new_positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Rotate ``heads`` (``[T, NH, >=rot_dim]``, any strides) in place."""
    rot_dim = cos_sin_cache.shape[-1]
    if heads.shape[-1] < rot_dim:
        raise ValueError(f"head width {heads.shape[-1]} is smaller than rot_dim {rot_dim}")
    cos, sin = _delta_cos_sin(old_positions, new_positions, cos_sin_cache)
    rot = heads[..., :rot_dim]
    if is_neox:
        first, second = rot[..., : rot_dim // 2], rot[..., rot_dim // 2 :]
    else:
        first, second = rot[..., 0::2], rot[..., 1::2]
    x1, x2 = first.float(), second.float()
    new_first = x1 * cos - x2 * sin
    new_second = x2 * cos + x1 * sin
    first.copy_(new_first)
    second.copy_(new_second)


def rotary_embedding_k_fused(
    old_positions: torch.Tensor,
    new_positions: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Re-position ``key`` (``[T, NH*head_size]`` or ``[T, NH, head_size]``) in place."""
    heads = key.view(key.shape[0], -1, head_size)
    _rotate_heads(heads, old_positions, new_positions, cos_sin_cache, is_neox)


def rotary_embedding_k_fused_strided(
    old_positions: torch.Tensor,
    new_positions: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    head_stride: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Like :func:`rotary_embedding_k_fused` for keys whose heads lie ``head_stride``
    elements apart; only the leading ``head_size`` elements of each head take part.

    As in the native kernel, ``key``'s own strides are not consulted: head ``h`` of token
    ``t`` starts ``(t * NH + h) * head_stride`` elements after ``key``'s first element,
    with ``NH = key.shape[-2]`` (a 2-D key ``[T, NH * head_stride]`` is split into heads).
    So ``key`` may be the full ``[T, NH, head_stride]`` rows (fused K|V: the K half
    turns) or a window sliced out of them, e.g. an MLA latent's trailing rope dims
    ``latent[..., offset:]`` with the row width as ``head_stride``.
    """
    if head_size > head_stride:
        raise ValueError(f"head_size {head_size} exceeds head_stride {head_stride}")
    if key.dim() == 2:
        tokens, n_heads = key.shape[0], key.shape[1] // head_stride
    else:
        n_heads = key.shape[-2]
        tokens = key.numel() // max(key.shape[-1] * n_heads, 1)
    start = key.storage_offset()
    end = start + (tokens * n_heads - 1) * head_stride + head_size
    if tokens and n_heads and end > key.untyped_storage().nbytes() // key.element_size():
        raise ValueError(
            f"{tokens} tokens x {n_heads} heads of stride {head_stride} overrun the key's storage"
        )
    heads = key.as_strided(
        (tokens, n_heads, head_size), (n_heads * head_stride, head_stride, 1), start
    )
    _rotate_heads(heads, old_positions, new_positions, cos_sin_cache, is_neox)
