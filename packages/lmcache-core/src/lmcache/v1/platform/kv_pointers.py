"""Engine buffers given as raw addresses: their shape, strides and dtype from ``shape_desc``.

The geometry half of pointer mode, shared by the torch baseline (which wraps host
addresses in views) and every native kernel (which only needs the numbers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from lmcache.v1.platform.kv_formats import KVFormatSpec
from lmcache.v1.platform.kv_geometry import (
    Buf,
    EngineGeometry,
    flatten_engine_buffers,
    geometry_from_bufs,
)
from lmcache.v1.platform.ops_types import PageBufferShapeDesc

__all__ = [
    "geometry_from_pointers",
    "infer_kv_dtype",
    "pointer_bufs",
    "pointer_container",
    "pointer_count",
    "pointer_tensor_geometry",
]

_ELEMENT_SIZE_DTYPES = {1: torch.uint8, 2: torch.float16, 4: torch.float32}


# --------------------------------------------------------------------------------------


def infer_kv_dtype(shape_desc: PageBufferShapeDesc) -> torch.dtype:
    """The dtype of raw-pointer buffers: ``shape_desc.dtype``, else by ``element_size``."""
    dtype = shape_desc.dtype
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype:
        candidate = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(candidate, torch.dtype):
            return candidate
    try:
        return _ELEMENT_SIZE_DTYPES[int(shape_desc.element_size)]
    except KeyError:
        raise ValueError(
            f"cannot infer the KV dtype: shape_desc.dtype={dtype!r}, "
            f"element_size={shape_desc.element_size!r}"
        ) from None


def pointer_count(spec: KVFormatSpec, num_pointers: int, num_layers: int) -> int:
    """Tensors per pointer group (planes per layer for tuple layouts), validated."""
    expected = {"cross": 1, "layers": num_layers, "kv_layers": 2 * num_layers}
    if spec.container in expected:
        if num_pointers != expected[spec.container]:
            raise ValueError(
                f"{spec.engine_kv_format.name}: expected {expected[spec.container]} buffer "
                f"pointers (shape_desc.nl={num_layers}), got {num_pointers}"
            )
        return 1
    if num_layers <= 0 or num_pointers % num_layers:
        raise ValueError(
            f"{spec.engine_kv_format.name}: {num_pointers} pointers do not split into "
            f"shape_desc.nl={num_layers} layers"
        )
    return num_pointers // num_layers


def pointer_tensor_geometry(
    spec: KVFormatSpec, desc: PageBufferShapeDesc, planes: int
) -> tuple[list[int], list[int]]:
    """Shape and element strides of one engine buffer described by ``shape_desc``.

    ``planes`` is the :func:`pointer_count` of an ``HS``-tuple layout (MLA planes share
    ``shape_desc.hs`` equally), else 1.
    """
    sizes = {
        "KV": 2,
        "NL": desc.nl,
        "NB": desc.nb,
        "BS": desc.bs,
        "PBS": desc.nb * desc.bs,
        "NH": desc.nh,
        "HS": desc.hs // planes,
        "ONE": 1,
    }
    shape = [int(sizes[name]) for name in spec.dims]
    if min(shape) <= 0:
        raise ValueError(f"{spec.engine_kv_format.name}: shape_desc gives shape {shape}")
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    block_stride = int(desc.block_stride_elems)
    if block_stride and "NB" in spec.dims:
        nb_axis = spec.dims.index("NB")
        if block_stride < strides[nb_axis]:
            raise ValueError(
                f"shape_desc.block_stride_elems={block_stride} is smaller than one block "
                f"({strides[nb_axis]} elements)"
            )
        strides[nb_axis] = block_stride
        for axis in range(nb_axis - 1, -1, -1):
            strides[axis] = strides[axis + 1] * shape[axis + 1]
    elif block_stride and block_stride != math.prod(shape[1:]):
        raise ValueError(f"{spec.engine_kv_format.name}: non-tight block stride unsupported")
    return shape, strides


def pointer_container(spec: KVFormatSpec, buffers: list[Any], num_layers: int) -> Any:
    """Arrange per-pointer buffers the way the format's container expects."""
    if spec.container in ("cross", "layers", "kv_layers"):
        return buffers
    per_layer = len(buffers) // num_layers
    return [tuple(buffers[i * per_layer : (i + 1) * per_layer]) for i in range(num_layers)]


def pointer_bufs(
    pointers: Sequence[int], spec: KVFormatSpec, desc: PageBufferShapeDesc, device: Any
) -> Any:
    """Raw engine pointers as :class:`Buf` records in the format's container."""
    dtype = infer_kv_dtype(desc)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    nl = int(desc.nl)
    planes = pointer_count(spec, len(pointers), nl)
    shape, strides = pointer_tensor_geometry(spec, desc, planes if spec.tuple_axis == "HS" else 1)
    dev = torch.device(device)
    bufs = [Buf(int(p), shape, strides, itemsize, dtype, dev) for p in pointers]
    return pointer_container(spec, bufs, nl)


def geometry_from_pointers(
    pointers: Sequence[int],
    spec: KVFormatSpec,
    desc: PageBufferShapeDesc,
    device: Any,
    root: str,
) -> EngineGeometry:
    """Plane groups for engine buffers given as addresses, shaped by ``shape_desc``.

    Pointer order: ``layers``/``cross`` one per layer; ``kv_layers`` every K then every V;
    ``layer_tuples`` layer-major (``K_0, V_0, K_1, ...`` or the planes of layer 0 first).
    MLA planes described by pointers share ``shape_desc.hs`` equally.
    """
    items = flatten_engine_buffers(pointer_bufs(pointers, spec, desc, device), spec)
    return geometry_from_bufs(items, spec, int(desc.bs), root)
