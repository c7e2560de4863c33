"""Loads (H2D) and stores (D2H) copy runs of consecutive engine blocks as slices, and
scatter or gather the rest.

On CPU ``index_copy_`` moves about 0.45x memcpy whatever the ids; one slice copy per run
of consecutive blocks is near memcpy when the runs are long (issue 32).  Both paths must
land the same bytes as the naive reference.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kv_reference import Geometry
from test_block_transfer import ALL_FORMATS, round_trip

from lmcache.v1.platform.ops_types import EngineKVFormat
from lmcache.v1.platform.torch_ops import mp_mem_kernels
from lmcache.v1.platform.torch_ops.mp_mem_kernels import MIN_MEAN_RUN_BLOCKS, consecutive_runs


def test_consecutive_runs() -> None:
    ids = torch.tensor([4, 5, 6, 7, 8, 9, 10, 11])
    assert consecutive_runs(ids) == [(0, 4, 8)]
    long_runs = torch.tensor(list(range(10, 18)) + list(range(40, 48)))
    assert consecutive_runs(long_runs) == [(0, 10, 8), (8, 40, 8)]
    # Short runs: a scatter is faster than many slice copies.
    assert consecutive_runs(torch.tensor([3, 1, 2, 9])) is None
    assert consecutive_runs(torch.tensor([7])) == [(0, 7, 1)]
    assert MIN_MEAN_RUN_BLOCKS == 8


@pytest.fixture
def count_scatters(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = torch.Tensor.index_copy_

    def counting(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "index_copy_", counting)
    return calls


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: EngineKVFormat(f).name)
def test_consecutive_blocks_load_without_a_scatter(fmt: int, count_scatters: list[int]) -> None:
    g = Geometry(nl=2, nb=12, bs=2, nh=2, hs=4)
    # Two objects of 4 blocks: each one run of consecutive engine blocks.
    round_trip(mp_mem_kernels, fmt, g, torch.float16, [2, 3, 4, 5, 8, 9, 10, 11], 4, 0)
    assert count_scatters == []


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: EngineKVFormat(f).name)
def test_scattered_blocks_still_scatter(fmt: int, count_scatters: list[int]) -> None:
    g = Geometry(nl=2, nb=12, bs=2, nh=2, hs=4)
    round_trip(mp_mem_kernels, fmt, g, torch.float32, [7, 2, 9, 0, 5, 11, 1, 3], 4, 0)
    assert count_scatters


@pytest.fixture
def count_gathers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real_fn, real_method = torch.index_select, torch.Tensor.index_select

    def counting_fn(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return real_fn(*args, **kwargs)

    def counting_method(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return real_method(self, *args, **kwargs)

    monkeypatch.setattr(torch, "index_select", counting_fn)
    monkeypatch.setattr(torch.Tensor, "index_select", counting_method)
    return calls


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: EngineKVFormat(f).name)
def test_consecutive_blocks_store_without_a_gather(fmt: int, count_gathers: list[int]) -> None:
    g = Geometry(nl=2, nb=12, bs=2, nh=2, hs=4)
    round_trip(mp_mem_kernels, fmt, g, torch.bfloat16, [1, 2, 3, 4, 6, 7, 8, 9], 4, 0)
    assert count_gathers == []


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: EngineKVFormat(f).name)
def test_scattered_blocks_still_gather(fmt: int, count_gathers: list[int]) -> None:
    g = Geometry(nl=2, nb=12, bs=2, nh=2, hs=4)
    round_trip(mp_mem_kernels, fmt, g, torch.float32, [7, 2, 9, 0, 5, 11, 1, 3], 4, 0)
    assert count_gathers
