"""RoPE re-positioning against a straightforward rotate-half / interleaved reference."""

from __future__ import annotations

from typing import Any

import pytest
import torch


def cos_sin_cache(max_pos: int, rot_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x: torch.Tensor, pos: torch.Tensor, cache: torch.Tensor, neox: bool) -> torch.Tensor:
    """Reference forward RoPE on [T, NH, head] in float64, one token and head at a time."""
    rot = cache.shape[-1]
    half = rot // 2
    out = x.clone().double()
    for t in range(x.shape[0]):
        cos, sin = cache[pos[t], :half], cache[pos[t], half:]
        for h in range(x.shape[1]):
            v = x[t, h, :rot].double()
            if neox:
                a, b = v[:half], v[half:]
                out[t, h, :half], out[t, h, half:rot] = a * cos - b * sin, b * cos + a * sin
            else:
                a, b = v[0::2], v[1::2]
                out[t, h, 0:rot:2], out[t, h, 1:rot:2] = a * cos - b * sin, b * cos + a * sin
    return out


TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 1e-1}


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("strided", [False, True])
def test_repositioning_matches_reference(ops: Any, dtype: torch.dtype, neox: bool,
                                         strided: bool) -> None:  # fmt: skip
    tokens, heads, head_size, rot_dim, stride = 6, 3, 16, 8, 24
    cache = cos_sin_cache(64, rot_dim)
    old = torch.tensor([0, 5, 9, 17, 30, 2])
    new = torch.tensor([40, 1, 9, 3, 63, 20])
    raw = torch.randn(tokens, heads, head_size, dtype=torch.float64)
    rotated_old = apply_rope(raw, old, cache, neox)
    want = apply_rope(raw, new, cache, neox)
    if strided:
        key = torch.zeros(tokens, heads, stride, dtype=dtype)
        key[..., :head_size] = rotated_old.to(dtype)
        key[..., head_size:] = 5
        flat = key.view(tokens, heads * stride)
        ops.rotary_embedding_k_fused_strided(old, new, flat, head_size, stride,
                                             cache.to(dtype), neox)  # fmt: skip
        assert (key[..., head_size:] == 5).all()
        got = key[..., :head_size]
    else:
        key = rotated_old.to(dtype).reshape(tokens, heads * head_size)
        ops.rotary_embedding_k_fused(old, new, key, head_size, cache.to(dtype), neox)
        got = key.view(tokens, heads, head_size)
    torch.testing.assert_close(got.double(), want, atol=TOLERANCE[dtype] * 8, rtol=TOLERANCE[dtype])
