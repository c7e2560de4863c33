"""Memory formats and the byte geometry of memory objects.

:class:`MemoryFormat` names the layout of the tensor a memory object holds; the helpers
normalise the flexible ``shapes``/``dtypes`` arguments of the allocators and compute where
each part of a multi-tensor object starts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

import torch


class MemoryFormat(Enum):
    """Layout of the tensor held by a memory object."""

    UNDEFINED = 0
    # [2, num_layers, num_tokens, hidden_dim]
    KV_2LTD = 1
    # [num_tokens, 2, hidden_dim]
    KV_T2D = 2
    # [2, num_tokens, hidden_dim]
    KV_2TD = 3
    # compressed binary array
    BINARY = 4
    # raw byte buffer
    BINARY_BUFFER = 5
    # [1, num_layers, num_tokens, aligned_head_size]
    KV_MLA_FMT = 6
    # [num_tokens, hidden_dim] (encoder cache)
    EC_TD = 7
    # [num_tokens, hidden_dim] (hidden-state store)
    HS_TD = 8

    def token_dim(self) -> int:
        """Index of the token dimension in this layout."""
        return _TOKEN_DIMS[self]


_TOKEN_DIMS: dict[MemoryFormat, int] = {
    MemoryFormat.UNDEFINED: 0,
    MemoryFormat.KV_2LTD: 2,
    MemoryFormat.KV_T2D: 1,
    MemoryFormat.KV_2TD: 0,
    MemoryFormat.BINARY: 0,
    MemoryFormat.BINARY_BUFFER: 0,
    MemoryFormat.KV_MLA_FMT: 2,
    MemoryFormat.EC_TD: 0,
    MemoryFormat.HS_TD: 0,
}

ShapesArg = torch.Size | Sequence[torch.Size]
DtypesArg = torch.dtype | Sequence[torch.dtype]


def normalize_shapes_dtypes(
    shapes: ShapesArg | Sequence[int], dtypes: DtypesArg
) -> tuple[list[torch.Size], list[torch.dtype]]:
    """Lists of ``torch.Size`` and dtypes of equal length from the flexible arguments."""
    if isinstance(shapes, torch.Size) or (
        isinstance(shapes, Sequence) and all(isinstance(s, int) for s in shapes)
    ):
        shape_list = [torch.Size(shapes)]  # type: ignore[arg-type]
    else:
        shape_list = [torch.Size(s) for s in shapes]  # type: ignore[arg-type,union-attr]
    dtype_list = [dtypes] if isinstance(dtypes, torch.dtype) else list(dtypes)
    if len(dtype_list) == 1 and len(shape_list) > 1:
        dtype_list = dtype_list * len(shape_list)
    if len(shape_list) != len(dtype_list) or not shape_list:
        raise ValueError(f"{len(shape_list)} shapes but {len(dtype_list)} dtypes")
    return shape_list, dtype_list


def tensor_nbytes(shape: torch.Size, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


# Parts of a multi-tensor object start on this boundary so each can be viewed in its dtype.
PART_ALIGNMENT = 64


def part_offsets(shapes: Sequence[torch.Size], dtypes: Sequence[torch.dtype]) -> list[int]:
    """Byte offset of each part of a multi-tensor object; the last entry is the total size."""
    if len(shapes) == 1:
        return [0, shapes[0].numel() * dtypes[0].itemsize]
    offsets = [0]
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
        end = offsets[-1] + tensor_nbytes(shape, dtype)
        if i + 1 < len(shapes):
            end = -(-end // PART_ALIGNMENT) * PART_ALIGNMENT
        offsets.append(end)
    return offsets
