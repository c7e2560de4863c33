"""Bitmap against a model: a size and the Python set of its set positions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from lmcache.compat.upstream_056.native_compat.bitmap import Bitmap

sizes = st.integers(min_value=0, max_value=80)
# Positions run past the largest size so the out-of-range no-op paths are exercised.
positions = st.integers(min_value=0, max_value=100)


@st.composite
def bitmaps(draw: st.DrawFn) -> tuple[Bitmap, set[int], int]:
    size = draw(sizes)
    members = draw(st.sets(st.integers(min_value=0, max_value=max(size - 1, 0)), max_size=size))
    members = {m for m in members if m < size}
    bitmap = Bitmap(size)
    for position in members:
        bitmap.set(position)
    return bitmap, members, size


def _leading(members: set[int], size: int, value: bool) -> int:
    count = 0
    while count < size and (count in members) == value:
        count += 1
    return count


def assert_matches(bitmap: Bitmap, members: set[int], size: int) -> None:
    assert bitmap.size() == len(bitmap) == size
    assert bitmap.get_indices_list() == sorted(members)
    assert bitmap.get_indices_set() == members
    assert bitmap.popcount() == len(members)
    assert bitmap.count_leading_zeros() == _leading(members, size, False)
    assert bitmap.count_leading_ones() == _leading(members, size, True)
    assert bitmap.highest_set_bit() == (max(members) if members else -1)
    assert repr(bitmap) == str(bitmap) == "".join("1" if i in members else "0" for i in range(size))
    for position in range(size + 3):
        assert bitmap.test(position) == (position in members)


class BitmapMachine(RuleBasedStateMachine):
    """Mutations in any order keep the bitmap equal to the set model."""

    @initialize(size=sizes, prefix=st.none() | positions)
    def make(self, size: int, prefix: int | None) -> None:
        self.size = size
        if prefix is None:
            self.bitmap = Bitmap(size)
            self.model: set[int] = set()
        else:
            self.bitmap = Bitmap(size, prefix)
            self.model = set(range(min(prefix, size)))

    @rule(position=positions)
    def set_bit(self, position: int) -> None:
        self.bitmap.set(position)
        if position < self.size:
            self.model.add(position)

    @rule(position=positions)
    def clear_bit(self, position: int) -> None:
        self.bitmap.clear(position)
        self.model.discard(position)

    @rule(indices=st.lists(positions, max_size=12))
    def batched_set(self, indices: list[int]) -> None:
        self.bitmap.batched_set(indices)
        self.model |= {i for i in indices if i < self.size}

    @rule(start=positions, end=positions)
    def set_range(self, start: int, end: int) -> None:
        self.bitmap.set_range(start, end)
        self.model |= set(range(start, min(end, self.size)))

    @rule()
    def copy_is_independent(self) -> None:
        duplicate = self.bitmap.copy()
        assert_matches(duplicate, self.model, self.size)
        duplicate.set_range(0, self.size)
        assert self.bitmap.popcount() == len(self.model)

    @invariant()
    def matches_model(self) -> None:
        if hasattr(self, "bitmap"):
            assert_matches(self.bitmap, self.model, self.size)


TestBitmapMachine = BitmapMachine.TestCase
TestBitmapMachine.settings = settings(max_examples=150, stateful_step_count=20, deadline=None)


@settings(max_examples=300, deadline=None)
@given(left=bitmaps(), right=bitmaps())
def test_and_or_truncate_to_the_smaller_size(
    left: tuple[Bitmap, set[int], int], right: tuple[Bitmap, set[int], int]
) -> None:
    (a, a_set, a_size), (b, b_set, b_size) = left, right
    size = min(a_size, b_size)
    assert_matches(a & b, {i for i in a_set & b_set if i < size}, size)
    assert_matches(a | b, {i for i in a_set | b_set if i < size}, size)
    # The operands are not changed.
    assert_matches(a, a_set, a_size)
    assert_matches(b, b_set, b_size)


@settings(max_examples=300, deadline=None)
@given(drawn=bitmaps())
def test_invert_stays_within_size(drawn: tuple[Bitmap, set[int], int]) -> None:
    bitmap, members, size = drawn
    inverted = ~bitmap
    assert_matches(inverted, set(range(size)) - members, size)
    assert_matches(~inverted, members, size)
    assert (bitmap & inverted).popcount() == 0
    assert (bitmap | inverted).popcount() == size


@settings(max_examples=200, deadline=None)
@given(drawn=bitmaps(), extra=st.integers(min_value=-5, max_value=5))
def test_gather_picks_set_positions_within_items(
    drawn: tuple[Bitmap, set[int], int], extra: int
) -> None:
    bitmap, members, size = drawn
    items = [f"item{i}" for i in range(max(size + extra, 0))]
    expected = [items[i] for i in sorted(members) if i < len(items)]
    assert bitmap.gather(items) == expected
    assert bitmap.gather(tuple(items)) == expected


def test_constructor_prefix_is_clamped() -> None:
    assert_matches(Bitmap(5, 100), set(range(5)), 5)
    assert_matches(Bitmap(0, 3), set(), 0)
    assert_matches(Bitmap(size=9, prefix_bits=8), set(range(8)), 9)


@pytest.mark.parametrize("bad", [-1, 1.5, "3", None, 1 << 64])
def test_a_position_that_is_no_size_t_is_a_type_error(bad: object) -> None:
    # pybind11 refuses to convert these to size_t: TypeError, never a silent no-op.
    bitmap = Bitmap(8)
    for call in (bitmap.set, bitmap.clear, bitmap.test):
        with pytest.raises(TypeError):
            call(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Bitmap(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        bitmap.set_range(0, bad)  # type: ignore[arg-type]


def test_batched_set_converts_every_index_before_setting_any() -> None:
    bitmap = Bitmap(8)
    with pytest.raises(TypeError):
        bitmap.batched_set([1, 2, -3])
    assert bitmap.popcount() == 0
    with pytest.raises(TypeError):
        bitmap.batched_set("12")  # type: ignore[arg-type]


def test_operators_refuse_other_types() -> None:
    bitmap = Bitmap(4, 2)
    with pytest.raises(TypeError):
        bitmap & 3  # type: ignore[operator]
    with pytest.raises(TypeError):
        bitmap | {1}  # type: ignore[operator]
    with pytest.raises(TypeError):
        bitmap.gather({0: "a"})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        bitmap.gather({"a", "b"})  # type: ignore[arg-type]


def test_native_module_reexports_it() -> None:
    from lmcache import lmcache_native

    assert lmcache_native.Bitmap is Bitmap
