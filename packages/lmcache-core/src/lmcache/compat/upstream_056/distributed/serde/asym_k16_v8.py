"""Upstream's K16/V8 serde classes over its multi-output group interface.

Both modes send ``(K, V)`` groups through the product's K16/V8 encoding
(:func:`lmcache.v1.storage_backend.serde.asym_k16_v8.encode_kv`: keys bit-exact, values
as per-tensor-scaled fp8):

* storage-only-dequant (:class:`AsymK16V8MultiSerializer`): K and V both stored;
* V only (:class:`AsymK16V8VOnlyMultiSerializer`): K stays in host memory, the blob holds
  V alone (a third of the storage-only blob); its deserializer refuses a blob with K.

The bytes are the product's, not upstream's ``EncodedKV`` header format
(``lmcache.v1.kv_codec`` is not provided); its ``scale_scope`` / ``scale_dtype`` choices
are not offered (per-tensor float32 scales only).
"""

from __future__ import annotations

from typing import Any

import torch

from lmcache.compat.upstream_056.distributed.serde.multi import (
    LayoutDescGroup,
    MemoryObjGroup,
    MultiDeserializer,
    MultiSerializer,
    validate_group_size,
)
from lmcache.v1.storage_backend.serde.asym_k16_v8 import (
    decode_kv,
    encode_kv,
    encoded_kv_size,
    read_k_bytes,
)
from lmcache.v1.storage_backend.serde.base import layout_numel

_GROUP = 2


def _tensor(obj: Any) -> torch.Tensor | None:
    return None if obj is None else obj.tensor


def _write(dst: Any, blob: torch.Tensor, who: str) -> int:
    if dst.tensor is None:
        raise ValueError(f"{who}: dst.tensor is None")
    out = dst.tensor.reshape(-1).view(torch.uint8)
    if out.numel() < blob.numel():
        raise ValueError(f"{who}: dst capacity {out.numel()} below required {blob.numel()}")
    out[: blob.numel()].copy_(blob)
    return int(blob.numel())


def _source(src: Any, who: str) -> torch.Tensor:
    if src.tensor is None:
        raise ValueError(f"{who}: src.tensor is None")
    return src.tensor.reshape(-1).view(torch.uint8)


def _layout_bytes(layout: Any) -> tuple[int, int]:
    counts = layout_numel(layout.shapes)
    return sum(n * d.itemsize for n, d in zip(counts, layout.dtypes)), sum(counts)


class AsymK16V8MultiSerializer(MultiSerializer):
    """``(K, V)`` into one blob: K bit-exact, V as fp8 (``fp8_dtype``)."""

    def __init__(self, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> None:
        self._fp8 = fp8_dtype

    @property
    def group_size(self) -> int:
        return _GROUP

    def serialize(self, src: MemoryObjGroup, dst: Any, key: Any) -> int:
        validate_group_size(src, _GROUP, role="src")
        k, v = (_tensor(o) for o in src)
        if k is None or v is None:
            raise ValueError(
                "AsymK16V8MultiSerializer (storage-only-dequant): both K and V must be provided"
            )
        return _write(dst, encode_kv(k, v, self._fp8), "AsymK16V8MultiSerializer")

    def estimate_serialized_size(self, layout_descs: LayoutDescGroup) -> int:
        validate_group_size(layout_descs, _GROUP, role="layout")
        k_layout, v_layout = layout_descs
        if k_layout is None or v_layout is None:
            raise ValueError(
                "AsymK16V8MultiSerializer (storage-only-dequant): both K and V layouts required"
            )
        return encoded_kv_size(_layout_bytes(k_layout)[0], _layout_bytes(v_layout)[1])


class AsymK16V8MultiDeserializer(MultiDeserializer):
    """A storage-only blob into ``(K_out, V_out)``; a None slot is left alone."""

    def __init__(self, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> None:
        self._fp8 = fp8_dtype

    @property
    def group_size(self) -> int:
        return _GROUP

    def deserialize(self, src: Any, dst: MemoryObjGroup, key: Any) -> None:
        validate_group_size(dst, _GROUP, role="dst")
        k_out, v_out = (_tensor(o) for o in dst)
        decode_kv(_source(src, "AsymK16V8MultiDeserializer"), k_out, v_out, self._fp8)


class AsymK16V8VOnlyMultiSerializer(MultiSerializer):
    """``(None, V)`` into a V-only blob (K stays in host memory)."""

    def __init__(self, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> None:
        self._fp8 = fp8_dtype

    @property
    def group_size(self) -> int:
        return _GROUP

    def serialize(self, src: MemoryObjGroup, dst: Any, key: Any) -> int:
        validate_group_size(src, _GROUP, role="src")
        k_obj, v_obj = src
        if k_obj is not None:
            raise ValueError(
                "AsymK16V8VOnlyMultiSerializer (split-tier): K slot must be None; K stays "
                "in host memory in this mode (AsymK16V8MultiSerializer stores both)"
            )
        v = _tensor(v_obj)
        if v is None:
            raise ValueError("AsymK16V8VOnlyMultiSerializer: V slot is required")
        return _write(dst, encode_kv(None, v, self._fp8), "AsymK16V8VOnlyMultiSerializer")

    def estimate_serialized_size(self, layout_descs: LayoutDescGroup) -> int:
        validate_group_size(layout_descs, _GROUP, role="layout")
        k_layout, v_layout = layout_descs
        if k_layout is not None:
            raise ValueError("AsymK16V8VOnlyMultiSerializer: K layout must be None")
        if v_layout is None:
            raise ValueError("AsymK16V8VOnlyMultiSerializer: V layout is required")
        return encoded_kv_size(0, _layout_bytes(v_layout)[1])


class AsymK16V8VOnlyMultiDeserializer(MultiDeserializer):
    """A V-only blob into ``V_out``; the K slot is never touched.  A blob holding K
    (storage-only-dequant) is refused."""

    def __init__(self, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> None:
        self._fp8 = fp8_dtype

    @property
    def group_size(self) -> int:
        return _GROUP

    def deserialize(self, src: Any, dst: MemoryObjGroup, key: Any) -> None:
        validate_group_size(dst, _GROUP, role="dst")
        v_out = _tensor(dst[1])
        if v_out is None:
            return
        payload = _source(src, "AsymK16V8VOnlyMultiDeserializer")
        k_len = read_k_bytes(payload)
        if k_len:
            raise ValueError(
                f"AsymK16V8VOnlyMultiDeserializer: blob holds {k_len} K bytes, a "
                "storage-only-dequant blob; use AsymK16V8MultiDeserializer"
            )
        decode_kv(payload, None, v_out, self._fp8)


__all__ = [
    "AsymK16V8MultiDeserializer",
    "AsymK16V8MultiSerializer",
    "AsymK16V8VOnlyMultiDeserializer",
    "AsymK16V8VOnlyMultiSerializer",
]
