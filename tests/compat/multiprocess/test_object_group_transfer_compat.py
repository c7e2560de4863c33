"""lmcache-core's own checks of ``batched_iteration_with_skip`` beyond upstream's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lmcache.compat.upstream_056.object_group_transfer import batched_iteration_with_skip


def _count_up(limit: int, pulled: list[int]) -> Iterator[int]:
    for value in range(limit):
        pulled.append(value)
        yield value


def test_accepts_any_iterable_and_is_lazy() -> None:
    """A generator input works, and only the items a consumer asks for are read."""
    pulled: list[int] = []
    batches = batched_iteration_with_skip(_count_up(1000, pulled), batch_size=3, skip_count=4)
    assert next(batches) == (4, (4, 5, 6))
    assert pulled == list(range(7))


@pytest.mark.parametrize("size", [0, 1, 5, 17])
@pytest.mark.parametrize("batch_size", [1, 2, 7])
@pytest.mark.parametrize("skip", [0, 3, 20])
def test_batches_cover_the_tail_in_order(size: int, batch_size: int, skip: int) -> None:
    data = [f"item{i}" for i in range(size)]
    result = list(batched_iteration_with_skip(data, batch_size, skip))
    assert [item for _, batch in result for item in batch] == data[skip:]
    for start, batch in result:
        assert data[start : start + len(batch)] == list(batch)
        assert 1 <= len(batch) <= batch_size
    assert all(len(batch) == batch_size for _, batch in result[:-1])


def test_errors_are_raised_on_first_next() -> None:
    batches = batched_iteration_with_skip([1], batch_size=0, skip_count=0)
    with pytest.raises(ValueError, match="batch size must be at least one"):
        next(batches)
