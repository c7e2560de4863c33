"""torch dtype names as the multiprocess wire spells them (``float16``, not ``half``).

A leaf: the IPC wrappers of :mod:`.base` and the KV layout both send dtypes by these names,
and neither may import the other.
"""

from __future__ import annotations

import torch

__all__ = ["dtype_to_str", "str_to_dtype"]


def dtype_to_str(dtype: torch.dtype) -> str:
    """torch's own dtype name without the module (``float16``), as sent on the MP wire.

    Not :func:`lmcache.utils.dtype_to_str`, whose short names (``half``) are part of
    cache keys and on-disk headers.
    """
    return str(dtype).removeprefix("torch.")


def str_to_dtype(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_to_str`; a ``torch.`` prefix is accepted too."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype
