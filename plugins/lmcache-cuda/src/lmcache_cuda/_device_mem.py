"""Zero-copy torch views over raw CUDA device memory (no native code, no copies)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch


class _DeviceBytes:
    """``__cuda_array_interface__`` over ``nbytes`` of device memory at ``ptr``."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
        }


def device_tensor(
    ptr: int,
    shape: Sequence[int],
    strides: Sequence[int] | None,
    dtype: torch.dtype,
    device: Any = None,
) -> torch.Tensor:
    """A tensor of ``shape``/``strides`` (elements) aliasing device memory at ``ptr``.

    Goes through a byte array because ``__cuda_array_interface__`` has no bfloat16 type.
    The caller keeps the memory alive.
    """
    shape = [int(s) for s in shape]
    if strides is None:
        strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if any(s == 0 for s in shape):
        return torch.empty(shape, dtype=dtype, device=device or "cuda")
    span = 1 + sum((size - 1) * int(stride) for size, stride in zip(shape, strides))
    target = torch.device(device) if device is not None else torch.device("cuda")
    raw = torch.as_tensor(_DeviceBytes(int(ptr), span * itemsize), device=target)
    return raw.view(dtype).as_strided(shape, [int(s) for s in strides])
