"""``asym_k16_v8``: keys kept at the model's dtype (16-bit), values stored as scaled fp8.

Keys are more sensitive to quantization than values (they go through the softmax), so
this serde keeps them bit-exact and spends one byte per value element: a 16-bit chunk
shrinks to 3/4 of its size (plus 8 bytes for the scale).

Values are scaled per chunk (``scale = max|V| / fp8 max``, 1.0 for an all-zero V) before
the cast, so the whole fp8 range is used whatever the magnitude of V.  Error bound per
value element ``v`` (e4m3fn; the fp32 dequantisation result is then rounded to the
chunk's dtype): ``|v - v'| <= 2**-4 * |v| + scale * 2**-10``.

The chunk's layout says where K and V are: dimension 0 of ``KV_2LTD`` and ``KV_2TD``,
dimension 1 of ``KV_T2D``.  Other layouts (MLA's single latent, raw buffers) have no V
to compress: encoding them raises :class:`SerdeError` and the tier skips the chunk.
"""

from __future__ import annotations

import struct

import torch

from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.storage_backend.serde.base import (
    SerdeError,
    byte_tensor,
    layout_numel,
)
from lmcache.v1.storage_backend.serde.fp8 import FP8_DTYPES, Fp8TensorStage, dequantize

KV_DIM: dict[MemoryFormat, int] = {
    MemoryFormat.KV_2LTD: 0,
    MemoryFormat.KV_2TD: 0,
    MemoryFormat.KV_T2D: 1,
}
_HEAD = struct.Struct("<fI")  # V's scale, K's byte count (0: V only); 8 bytes keep K aligned


def _split_kv(t: torch.Tensor, fmt: MemoryFormat) -> tuple[torch.Tensor, torch.Tensor]:
    dim = KV_DIM.get(fmt)
    if dim is None or t.dim() <= dim or t.shape[dim] != 2:
        raise SerdeError(f"asym_k16_v8 needs a K/V chunk (KV_2LTD, KV_2TD, KV_T2D), got {fmt}")
    return t.select(dim, 0), t.select(dim, 1)


def _check_float(t: torch.Tensor) -> None:
    if not t.dtype.is_floating_point or t.dtype in FP8_DTYPES.values():
        raise SerdeError(f"asym_k16_v8 needs floating-point KV, got {t.dtype}")


def encode_kv(k: torch.Tensor | None, v: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """``scale f32 | K byte count u32 | K bytes | V as scaled fp8`` (flat uint8); without
    ``k`` (K kept elsewhere) the K part is empty."""
    _check_float(v)
    v32 = v.float()
    amax = float(v32.abs().max()) if v32.numel() else 0.0
    limit = torch.finfo(fp8_dtype).max
    # amax is finite unless V holds inf/NaN; then a unit scale saturates the infinities
    # and keeps NaN as NaN rather than turning every element into NaN.
    scale = amax / limit if 0.0 < amax < float("inf") else 1.0
    q = (v32 / scale).clamp(-limit, limit).to(fp8_dtype).reshape(-1).view(torch.uint8)
    if k is None:
        k_bytes = torch.empty(0, dtype=torch.uint8)
    else:
        _check_float(k)
        k_bytes = k.contiguous().reshape(-1).view(torch.uint8)
    head = byte_tensor(_HEAD.pack(scale, k_bytes.numel()))
    return torch.cat([head, k_bytes, q])


def encoded_kv_size(k_bytes: int, v_numel: int) -> int:
    return _HEAD.size + k_bytes + v_numel


def read_k_bytes(payload: torch.Tensor) -> int:
    """The K byte count recorded in an :func:`encode_kv` output (0: V only)."""
    if payload.numel() < _HEAD.size:
        raise SerdeError("asym_k16_v8 payload shorter than its header")
    return int(_HEAD.unpack(payload[: _HEAD.size].numpy().tobytes())[1])


def decode_kv(
    payload: torch.Tensor,
    k_out: torch.Tensor | None,
    v_out: torch.Tensor | None,
    fp8_dtype: torch.dtype,
) -> None:
    """Fill ``k_out`` (bit-exact) and ``v_out`` (dequantised) from an :func:`encode_kv`
    output; a None output is skipped.  ``payload`` may run past the encoded bytes."""
    if payload.numel() < _HEAD.size:
        raise SerdeError("asym_k16_v8 payload shorter than its header")
    scale, k_len = _HEAD.unpack(payload[: _HEAD.size].numpy().tobytes())
    if k_out is not None:
        want = k_out.numel() * k_out.element_size()
        if k_len != want:
            raise SerdeError(f"asym_k16_v8 payload holds {k_len} K bytes, chunk needs {want}")
        raw = payload[_HEAD.size : _HEAD.size + k_len]
        k_out.copy_(raw.view(k_out.dtype).reshape(k_out.shape))
    if v_out is not None:
        start = _HEAD.size + k_len
        if payload.numel() < start + v_out.numel():
            raise SerdeError("asym_k16_v8 payload shorter than the chunk's V")
        q = payload[start : start + v_out.numel()].view(fp8_dtype)
        v_out.copy_((dequantize(q, torch.float32) * scale).reshape(v_out.shape))


class AsymK16V8Stage(Fp8TensorStage):
    """The ``asym_k16_v8`` stage: a chunk's K and V through :func:`encode_kv`."""

    name = "asym_k16_v8"

    def _one_part(self, parts: list[torch.Tensor]) -> torch.Tensor:
        if len(parts) != 1:
            raise SerdeError(f"asym_k16_v8 needs a one-tensor chunk, got {len(parts)} parts")
        return parts[0]

    def encode(self, parts: list[torch.Tensor], fmt: MemoryFormat) -> torch.Tensor:
        k, v = _split_kv(self._one_part(parts), fmt)
        return encode_kv(k, v, self.fp8_dtype)

    def decode(self, payload: torch.Tensor, out: list[torch.Tensor], fmt: MemoryFormat) -> None:
        k_out, v_out = _split_kv(self._one_part(out), fmt)
        needed = encoded_kv_size(k_out.numel() * k_out.element_size(), v_out.numel())
        if payload.numel() != needed:
            raise SerdeError(
                f"asym_k16_v8 payload holds {payload.numel()} bytes, chunk needs {needed}"
            )
        decode_kv(payload, k_out, v_out, self.fp8_dtype)

    def encoded_size(self, shapes: list[torch.Size], dtypes: list[torch.dtype]) -> int:
        total = layout_numel(shapes)[0]
        half = total // 2
        return encoded_kv_size(half * dtypes[0].itemsize, half)
