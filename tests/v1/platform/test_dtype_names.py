"""One pair of torch dtype-name helpers for the MP wire (platform/base/ipc_wrapper)."""

from __future__ import annotations

import pytest
import torch

from lmcache import utils
from lmcache.v1.multiprocess import kv_layout
from lmcache.v1.platform.base import ipc_wrapper


def test_kv_layout_uses_the_platform_helpers() -> None:
    assert kv_layout.dtype_name is ipc_wrapper.dtype_to_str
    assert kv_layout.dtype_from_name is ipc_wrapper.str_to_dtype


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.float8_e4m3fn]
)
def test_round_trip_with_and_without_the_module_prefix(dtype: torch.dtype) -> None:
    name = ipc_wrapper.dtype_to_str(dtype)
    assert not name.startswith("torch.")
    assert ipc_wrapper.str_to_dtype(name) is dtype
    assert ipc_wrapper.str_to_dtype(f"torch.{name}") is dtype


@pytest.mark.parametrize("bad", ["", "cuda", "Tensor", "float99", "torch."])
def test_unknown_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="unknown torch dtype"):
        ipc_wrapper.str_to_dtype(bad)


def test_cache_key_names_are_a_different_table() -> None:
    # Keys and on-disk headers use LMCache's short names; the wire uses torch's names.
    assert utils.dtype_to_str(torch.float16) == "half"
    assert ipc_wrapper.dtype_to_str(torch.float16) == "float16"
