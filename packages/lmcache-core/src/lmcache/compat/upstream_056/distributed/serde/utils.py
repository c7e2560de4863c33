"""Upstream's serde helpers for its storage controllers' temporary buffers."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch


def serialized_layout_desc(layout_desc: Any, serde: Any) -> Any:
    """A one-group uint8 layout of ``serde.estimate_serialized_size(layout_desc)`` bytes."""
    size = serde.estimate_serialized_size(layout_desc)
    return type(layout_desc)(shapes=[torch.Size([size])], dtypes=[torch.uint8])


def make_temp_key(original_key: Any) -> Any:
    """``original_key`` with 16 random bytes appended to its hash: a fresh key in the same
    model, rank, object group and ``cache_salt`` (so per-tenant accounting still counts
    the temporary buffer for its tenant)."""
    return dataclasses.replace(original_key, chunk_hash=original_key.chunk_hash + os.urandom(16))


__all__ = ["make_temp_key", "serialized_layout_desc"]
