"""CacheBlend re-RoPE geometry at upstream's ``modules.blend`` path, beyond upstream's own
tests: fused K|V detection from the format table, the fp8 scalar resolution, map bounds,
and the MLA window rotation through the torch baseline (upstream checks it on CUDA only)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lmcache import device_ops
from lmcache.compat.upstream_056.modules.blend import _cb_group_rope_geometry, _CBRopeState
from lmcache.v1.platform.kv_formats import EngineKVFormat as F


def _group(fmt: F | None = None, hs: int = 0, tokens: int = 16, slots: int = 16) -> SimpleNamespace:
    return SimpleNamespace(
        tokens_per_block=tokens,
        slots_per_block=slots,
        engine_kv_format=fmt,
        shape_desc=SimpleNamespace(hs=hs),
    )


def test_fused_kv_heads_are_twice_the_head_size() -> None:
    assert _cb_group_rope_geometry(_group(F.NL_X_NB_BS_NH_TWO_HS), 1, 4 * 128, 64, 0) == (
        True,
        128,
        4,
        0,
    )
    # a declared per-head width equal to head_size says the heads are not packed
    assert _cb_group_rope_geometry(_group(F.NL_X_NB_BS_NH_TWO_HS, hs=64), 1, 256, 64, 0) == (
        False,
        64,
        4,
        0,
    )
    assert _cb_group_rope_geometry(_group(F.NL_X_TWO_NB_BS_NH_HS), 2, 256, 64, 0)[0] is False


def test_geometry_guards() -> None:
    with pytest.raises(RuntimeError, match="compressed"):
        _cb_group_rope_geometry(_group(tokens=16, slots=4), 2, 256, 64, 0)
    with pytest.raises(RuntimeError, match="kv_size=3"):
        _cb_group_rope_geometry(_group(), 3, 256, 64, 0)
    with pytest.raises(RuntimeError, match="whole number"):
        _cb_group_rope_geometry(_group(), 2, 200, 64, 0)
    # a window at offset 0 is the legacy inference, not an MLA declaration
    assert _cb_group_rope_geometry(_group(), 2, 256, 64, 0, rot=(0, 64)) == (False, 64, 4, 0)


def test_state_maps() -> None:
    caches = [torch.zeros(4, 8), torch.ones(4, 8)]
    st = _CBRopeState(64, True, caches, [1, 0], group_rot=[(0, 64)], group_head_size=[64, 32])
    assert st.cache_for_group(0) is caches[1] and st.head_size_for_group(1) == 32
    assert st.head_size_for_group(5) == 64
    with pytest.raises(RuntimeError, match="no rope geometry"):
        st.rot_for_group(1)
    with pytest.raises(RuntimeError, match="no rope cache"):
        st.cache_for_group(2)
    assert _CBRopeState(64, True, [], [0]).cache_for_group(0) is None  # NoPE model


def test_key_scalar_type_resolves_fp8_through_the_declaration() -> None:
    plain = _CBRopeState(64, False, [], [])
    assert plain.key_scalar_type(torch.bfloat16) == 15
    assert plain.key_scalar_type(torch.uint8) is None
    assert _CBRopeState(64, False, [], [], kv_quant="fp8_e5m2").key_scalar_type(torch.uint8) == 23


def test_mla_window_rotation_leaves_the_content_dims() -> None:
    """Upstream's CUDA check of a trailing-window launch, on the torch baseline."""
    content, rope, n_tok, max_pos = 24, 8, 16, 256
    half = rope // 2
    inv = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) * 2 / rope))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv
    cache = torch.cat([ang.cos(), ang.sin()], dim=1).float()
    latents = torch.randn(n_tok, 1, content + rope)
    before = latents.clone()
    old = torch.randint(0, max_pos, (n_tok,))
    new = torch.randint(0, max_pos, (n_tok,))
    device_ops.rotary_embedding_k_fused_strided(
        old, new, latents[..., content:], rope, content + rope, cache, False
    )
    assert torch.equal(latents[..., :content], before[..., :content])
    # reference: GPT-J pairs, undo the old angle and apply the new one
    x, y = before[:, 0, content::2].double(), before[:, 0, content + 1 :: 2].double()
    delta = ang[new] - ang[old]
    want_x = x * delta.cos() - y * delta.sin()
    want_y = y * delta.cos() + x * delta.sin()
    torch.testing.assert_close(latents[:, 0, content::2].double(), want_x, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        latents[:, 0, content + 1 :: 2].double(), want_y, atol=1e-4, rtol=1e-4
    )
