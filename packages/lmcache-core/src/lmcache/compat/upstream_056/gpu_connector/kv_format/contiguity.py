"""Upstream LMCache 0.5.6's ``kv_format.contiguity``: zero-copy recovery of a tensor's
physical axis order, so that its ``shape`` describes its memory.

An engine may expose a permuted view (vLLM's HND cache is allocated ``[2, NB, NH, BS, HS]``
but shown as ``[2, NB, BS, NH, HS]``); ordering the axes by stride undoes that without
touching storage. A view that stays non-contiguous is accepted only in the one strided
form the transfer kernels honour -- padding between blocks (dim 0) -- and refused
otherwise. Never copies.
"""

from __future__ import annotations

import logging
import math

import torch

from lmcache.compat.upstream_056.gpu_connector.kv_format.types import DiscoverableKVCache

__all__ = ["attempt_permute_to_contiguous_view", "dim0_padding_elems"]

logger = logging.getLogger(__name__)


def dim0_padding_elems(tensor: torch.Tensor) -> int:
    """Elements of padding after each dim-0 row of an otherwise tightly packed view.

    Raises:
        ValueError: any axis but dim 0 is not tightly packed, or dim-0 rows overlap.
    """
    shape, stride = tuple(tensor.shape), tuple(tensor.stride())
    where = f"shape={shape}, stride={stride}, dtype={tensor.dtype}"
    if tensor.dim() < 2:
        raise ValueError(f"a non-contiguous KV view needs at least 2 axes ({where})")
    tight = 1
    for axis in range(tensor.dim() - 1, 0, -1):
        if shape[axis] != 1 and stride[axis] != tight:
            raise ValueError(
                f"non-contiguous KV view with padding inside axis {axis}, not a supported "
                "(dim-0 padding only) layout: only padding between blocks (axis 0) can be "
                f"transferred ({where})"
            )
        tight *= shape[axis]
    if stride[0] < tight:
        raise ValueError(f"KV view whose blocks overlap ({where})")
    return stride[0] - tight


def _physical_order(tensor: torch.Tensor) -> torch.Tensor:
    shape, stride = tensor.shape, tensor.stride()
    # Largest stride outermost. A size-1 axis tying with a neighbour goes inside it, so a
    # padded view and its packed twin get the same axis order.
    order = sorted(range(tensor.dim()), key=lambda i: (stride[i], shape[i] != 1), reverse=True)
    view = tensor.permute(order)
    if view.is_contiguous():
        return view
    padding = dim0_padding_elems(view)
    logger.debug(
        "accepting a KV view padded by %d elements per block: shape=%s stride=%s",
        padding,
        tuple(view.shape),
        tuple(view.stride()),
    )
    return view


def attempt_permute_to_contiguous_view(kv_caches: DiscoverableKVCache) -> DiscoverableKVCache:
    """``kv_caches`` with every tensor's axes in physical order (views of the same memory).

    Lists and tuples are rebuilt as lists holding the re-viewed tensors.

    Raises:
        ValueError: a tensor is strided in a way other than padding between blocks.
    """
    if isinstance(kv_caches, torch.Tensor):
        if kv_caches.dim() == 0 or math.prod(kv_caches.shape) == 0:
            return kv_caches
        return _physical_order(kv_caches)
    return [attempt_permute_to_contiguous_view(entry) for entry in kv_caches]
