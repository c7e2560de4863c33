"""BuddySpace: growing the space in place (the lazy allocator's committed prefix)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmcache.v1.memory.buddy import BuddySpace


def test_grow_adds_free_units_at_the_end_without_moving_used_runs() -> None:
    space = BuddySpace(4)
    first = space.take(3)
    assert first == 0
    assert space.take(2) is None  # only one unit left
    space.grow(12)
    assert space.total_units == 12 and space.used_units == 3
    assert space.take(8) == 3  # the old free unit and the new ones form one run
    assert space.is_consistent([(0, 3), (3, 8)])


def test_grow_merges_new_units_with_their_free_buddies() -> None:
    space = BuddySpace(4)
    space.grow(8)
    # Everything free: one block of 8 units, exactly as a fresh space of 8 units.
    assert space.largest_free_units() == 8
    assert space.is_consistent([])


def test_grow_refuses_to_shrink_and_accepts_the_same_size() -> None:
    space = BuddySpace(8)
    space.grow(8)
    assert space.is_consistent([])
    with pytest.raises(ValueError, match="cannot shrink"):
        space.grow(7)


@settings(max_examples=60, deadline=None)
@given(
    initial=st.integers(min_value=1, max_value=40),
    steps=st.lists(
        st.tuples(st.sampled_from(["take", "give", "grow"]), st.integers(1, 24)),
        max_size=40,
    ),
)
def test_random_takes_gives_and_growth_keep_the_space_consistent(
    initial: int, steps: list[tuple[str, int]]
) -> None:
    space = BuddySpace(initial)
    used: dict[int, int] = {}
    for op, n in steps:
        if op == "take":
            start = space.take(n)
            if start is not None:
                assert start + n <= space.total_units
                assert all(start + n <= s or s + u <= start for s, u in used.items())
                used[start] = n
        elif op == "give" and used:
            start = sorted(used)[n % len(used)]
            space.give(start, used.pop(start))
        elif op == "grow":
            space.grow(space.total_units + n)
        assert space.is_consistent(used.items())
    for start, units in list(used.items()):
        space.give(start, units)
    assert space.is_consistent([])
    # Fully free again: the same blocks as a space made at this size.
    fresh = BuddySpace(space.total_units)
    assert space.largest_free_units() == fresh.largest_free_units()
    assert space.take(space.total_units) == 0
