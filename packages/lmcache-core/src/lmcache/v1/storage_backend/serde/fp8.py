"""``fp8``: every element cast to an 8-bit float (1 byte per element on L2).

Upstream's semantics: a plain cast, no scale, ``fp8_dtype`` ``float8_e4m3fn`` (default:
3 mantissa bits, finite range +-448) or ``float8_e5m2`` (2 mantissa bits, +-57344).  One
difference: values beyond the range are saturated to it (a plain cast makes them NaN in
e4m3fn), so no stored chunk reads back NaN where the model had a number.

Error bound for an input ``x`` within the range, after the round trip (the fp8 value is
exact in fp16, bf16 and fp32, so only the cast to fp8 rounds):
``|x - x'| <= 2**-4 * |x| + 2**-10`` for e4m3fn and ``<= 2**-3 * |x| + 2**-17`` for e5m2
(half a unit in the last place of the mantissa, or half the subnormal step).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import torch

from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.storage_backend.serde.base import (
    Deserializer,
    SerdeError,
    Serializer,
    TensorStage,
    layout_numel,
)

FP8_DTYPES: dict[str, torch.dtype] = {
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
DEFAULT_FP8_DTYPE = "float8_e4m3fn"


def fp8_dtype_named(name: object) -> torch.dtype:
    """The fp8 dtype called ``name``; a clear error for anything else."""
    dtype = FP8_DTYPES.get(str(name))
    if dtype is None:
        raise ValueError(f"fp8_dtype {name!r} is not one of {', '.join(FP8_DTYPES)}")
    return dtype


def fp8_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_TABLE_DTYPES = (torch.float16, torch.bfloat16)
"""16-bit dtypes cast through a lookup table: torch's element-wise fp8 casts on CPU run at a
fraction of memory speed, a 64 KiB table indexed by the input's bits does not."""
_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


@cache
def _encode_table(src: torch.dtype, fp8_dtype: torch.dtype) -> np.ndarray:
    """fp8 byte of every 16-bit pattern of ``src``: torch's own saturated cast, once."""
    every = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(src)
    return _saturate(every, fp8_dtype).view(torch.uint8).numpy()


@cache
def _decode_table(fp8_dtype: torch.dtype, out: torch.dtype) -> np.ndarray:
    """Bits of ``out`` for every fp8 byte (exact: every fp8 value is one in fp16/bf16/fp32)."""
    every = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(fp8_dtype)
    return every.to(out).view(_BITS[out]).numpy()


def _saturate(t: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    limit = torch.finfo(fp8_dtype).max
    return t.clamp(-limit, limit).to(fp8_dtype)


def quantize(t: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """``t`` as ``fp8_dtype``, saturated to its finite range (NaN stays NaN)."""
    if not t.dtype.is_floating_point or t.dtype in FP8_DTYPES.values():
        raise SerdeError(f"fp8 serde needs 16/32-bit floating-point KV, got {t.dtype}")
    if t.dtype in _TABLE_DTYPES and t.device.type == "cpu":
        bits: Any = t.contiguous().view(torch.int16).numpy()
        table = _encode_table(t.dtype, fp8_dtype)
        return torch.from_numpy(table[bits.view(np.uint16)]).view(fp8_dtype)
    return _saturate(t, fp8_dtype)


def dequantize(q: torch.Tensor, out: torch.dtype) -> torch.Tensor:
    """The fp8 tensor ``q`` as ``out`` (a fresh tensor of ``q``'s shape)."""
    if out in _BITS and q.device.type == "cpu":
        table = _decode_table(q.dtype, out)
        raw: Any = q.contiguous().view(torch.uint8).numpy()
        return torch.from_numpy(table[raw]).view(out)
    return q.to(out)


class Fp8TensorStage(TensorStage):
    """A tensor stage writing fp8 of ``fp8_dtype``; its spec is ``<name>:<fp8 dtype>``."""

    name = ""

    def __init__(self, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> None:
        if fp8_dtype not in FP8_DTYPES.values():
            raise ValueError(f"fp8_dtype {fp8_dtype} is not one of {', '.join(FP8_DTYPES)}")
        self.fp8_dtype = fp8_dtype

    @property
    def spec(self) -> str:
        return f"{self.name}:{fp8_name(self.fp8_dtype)}"


class Fp8Stage(Fp8TensorStage):
    """The ``fp8`` stage: each part cast to ``fp8_dtype``, parts concatenated."""

    name = "fp8"

    def encode(self, parts: list[torch.Tensor], fmt: MemoryFormat) -> torch.Tensor:
        encoded = [quantize(t, self.fp8_dtype).reshape(-1).view(torch.uint8) for t in parts]
        return torch.cat(encoded) if encoded else torch.empty(0, dtype=torch.uint8)

    def decode(self, payload: torch.Tensor, out: list[torch.Tensor], fmt: MemoryFormat) -> None:
        needed = sum(t.numel() for t in out)
        if payload.numel() != needed:
            raise SerdeError(f"fp8 payload holds {payload.numel()} bytes, chunk needs {needed}")
        offset = 0
        for t in out:
            n = t.numel()
            q = payload[offset : offset + n].view(self.fp8_dtype)
            t.copy_(dequantize(q, t.dtype).reshape(t.shape))
            offset += n

    def encoded_size(self, shapes: list[torch.Size], dtypes: list[torch.dtype]) -> int:
        return sum(layout_numel(shapes))


class Fp8QuantizationSerializer(Serializer):
    """Upstream's ``fp8`` serializer: ``src.tensor`` cast into the bytes of ``dst.tensor``."""

    def __init__(self, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> None:
        self._stage = Fp8Stage(fp8_dtype)

    def serialize(self, src: Any, dst: Any, key: Any) -> int:
        src_t, dst_t = src.tensor, dst.tensor
        if src_t is None or dst_t is None:
            raise ValueError("fp8 serde needs src and dst objects with tensors")
        data = self._stage.encode([src_t], MemoryFormat.UNDEFINED)
        out = dst_t.reshape(-1).view(torch.uint8)
        if out.numel() < data.numel():
            raise ValueError(f"fp8 serde: dst holds {out.numel()} bytes, {data.numel()} needed")
        out[: data.numel()].copy_(data)
        return int(data.numel())

    def estimate_serialized_size(self, layout_desc: Any) -> int:
        # Exactly one byte per element: a margin would only make the tier store more.
        return sum(layout_numel(layout_desc.shapes))


class Fp8QuantizationDeserializer(Deserializer):
    """Upstream's ``fp8`` deserializer: the first ``dst.tensor.numel()`` bytes of
    ``src.tensor`` cast back into ``dst.tensor``'s dtype (``src`` may be larger)."""

    def __init__(self, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> None:
        self._stage = Fp8Stage(fp8_dtype)

    def deserialize(self, src: Any, dst: Any, key: Any) -> None:
        src_t, dst_t = src.tensor, dst.tensor
        if src_t is None or dst_t is None:
            raise ValueError("fp8 serde needs src and dst objects with tensors")
        data = src_t.reshape(-1).view(torch.uint8)[: dst_t.numel()]
        self._stage.decode(data, [dst_t], MemoryFormat.UNDEFINED)
