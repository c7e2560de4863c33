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


def _count_calls(monkeypatch: pytest.MonkeyPatch, *targets: tuple[Any, str]) -> list[int]:
    """Patch each ``(owner, name)`` to record a call in one shared list, then run the real one."""
    calls: list[int] = []
    for owner, name in targets:
        real = getattr(owner, name)

        def counting(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            calls.append(1)
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counting)
    return calls


@pytest.fixture
def index_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """Calls of the scatter (loads) and of the gather (stores) during a test."""
    return {
        "scatter": _count_calls(monkeypatch, (torch.Tensor, "index_copy_")),
        "gather": _count_calls(
            monkeypatch, (torch, "index_select"), (torch.Tensor, "index_select")
        ),
    }


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: EngineKVFormat(f).name)
def test_consecutive_blocks_copy_as_slices_both_ways(
    fmt: int, index_calls: dict[str, list[int]]
) -> None:
    g = Geometry(nl=2, nb=12, bs=2, nh=2, hs=4)
    # Two objects of 4 blocks: each one run of consecutive engine blocks.
    round_trip(mp_mem_kernels, fmt, g, torch.float16, [2, 3, 4, 5, 8, 9, 10, 11], 4, 0)
    assert index_calls == {"scatter": [], "gather": []}


@pytest.mark.parametrize("fmt", ALL_FORMATS, ids=lambda f: EngineKVFormat(f).name)
def test_scattered_blocks_still_scatter_and_gather(
    fmt: int, index_calls: dict[str, list[int]]
) -> None:
    g = Geometry(nl=2, nb=12, bs=2, nh=2, hs=4)
    round_trip(mp_mem_kernels, fmt, g, torch.bfloat16, [7, 2, 9, 0, 5, 11, 1, 3], 4, 0)
    assert index_calls["scatter"] and index_calls["gather"]
