"""ParallelPatternMatcher and RangePatternMatcher against naive element-by-element
references (upstream's algorithm, written out), plus their argument conversion."""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmcache.compat.upstream_056.native_compat.pattern_matcher import (
    ParallelPatternMatcher,
    RangePatternMatcher,
)

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1

# Few distinct values, so matches are frequent; among them values whose packed bytes
# contain other values' bytes at an offset (1 and 256, 0 and -1 ...), so a byte-level
# hit off an element boundary would show up as a wrong match.
values = st.sampled_from([0, 1, 2, -1, 256, 65536, 1 << 24, INT_MAX, INT_MIN])
sequences = st.lists(values, max_size=40)
patterns = st.lists(values, min_size=1, max_size=5)


def naive_positions(pattern: Sequence[int], data: Sequence[int]) -> list[int]:
    m = len(pattern)
    return [i for i in range(len(data) - m + 1) if list(data[i : i + m]) == list(pattern)]


def naive_ranges(
    start: Sequence[int], end: Sequence[int], data: Sequence[int]
) -> list[tuple[int, int]]:
    """Upstream's scan as specified: index by index, no shortcuts."""

    def at(pos: int, pattern: Sequence[int]) -> bool:
        return pos + len(pattern) <= len(data) and list(data[pos : pos + len(pattern)]) == list(
            pattern
        )

    ranges: list[tuple[int, int]] = []
    i = 0
    while i + len(start) <= len(data):
        if not at(i, start):
            i += 1
            continue
        for j in range(i + len(start), len(data) - len(end) + 1):
            if at(j, end):
                ranges.append((i, j + len(end)))
                i = j + len(end)
                break
        else:
            i += len(start)
    return ranges


@st.composite
def data_with_pattern(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Data, and a pattern that is either drawn freely or cut out of the data."""
    data = draw(sequences)
    if data and draw(st.booleans()):
        begin = draw(st.integers(min_value=0, max_value=len(data) - 1))
        length = draw(st.integers(min_value=1, max_value=min(5, len(data) - begin)))
        return data, data[begin : begin + length]
    return data, draw(patterns)


@settings(max_examples=400, deadline=None)
@given(drawn=data_with_pattern())
def test_parallel_matches_the_naive_scan(drawn: tuple[list[int], list[int]]) -> None:
    data, pattern = drawn
    expected = naive_positions(pattern, data)
    matcher = ParallelPatternMatcher(pattern)
    assert matcher.match(data) == expected
    assert matcher.match(tuple(data)) == expected


@settings(max_examples=400, deadline=None)
@given(
    data=sequences,
    start=patterns,
    end=patterns,
    plant=st.lists(st.integers(min_value=0, max_value=40), max_size=4),
)
def test_range_matches_the_naive_scan(
    data: list[int], start: list[int], end: list[int], plant: list[int]
) -> None:
    # Plant copies of both patterns so that ranges (and unclosed starts) are common.
    for n, where in enumerate(plant):
        where = min(where, len(data))
        data[where:where] = start if n % 2 == 0 else end
    assert RangePatternMatcher(start, end).match(data) == naive_ranges(start, end, data)


def test_upstreams_examples() -> None:
    data = [1, 1, 1, 1, 2, 3, 3, 3, 1, 2, 3, 3, 3]
    assert ParallelPatternMatcher([1, 2, 3]).match(data) == [3, 8]
    assert ParallelPatternMatcher([1, 1]).match([1, 1, 1, 1, 2]) == [0, 1, 2]
    data = [1, 2, 0, 3, 4, 0, 3, 4, 1, 2, 0, 0, 3, 4]
    assert RangePatternMatcher([1, 2], [3, 4]).match(data) == [(0, 5), (8, 14)]
    # A start inside a recorded range is not a new start.
    assert RangePatternMatcher([1], [9]).match([1, 2, 1, 3, 9, 5, 9]) == [(0, 5)]


def test_end_pattern_never_overlaps_the_start() -> None:
    assert RangePatternMatcher([1, 2], [2, 3]).match([1, 2, 3]) == []
    assert RangePatternMatcher([1, 2], [2, 3]).match([1, 2, 2, 3]) == [(0, 4)]
    assert RangePatternMatcher([7], [7]).match([7, 7, 7]) == [(0, 2)]


def test_misaligned_byte_hits_are_not_matches() -> None:
    # 256 packs as 00 01 00 00, so [256, 0] holds the bytes of 1 one byte in.
    assert ParallelPatternMatcher([1]).match([256, 0]) == []
    assert ParallelPatternMatcher([1]).match([256, 0, 1]) == [2]
    assert RangePatternMatcher([1], [1]).match([256, 0, 256, 0]) == []


def test_empty_inputs() -> None:
    assert ParallelPatternMatcher([5]).match([]) == []
    assert RangePatternMatcher([5], [6]).match([]) == []
    assert ParallelPatternMatcher([1, 2, 3]).match([1, 2]) == []
    assert RangePatternMatcher([1, 2, 3, 4], [5, 6]).match([1, 2, 3, 4]) == []


def test_empty_patterns_are_value_errors() -> None:
    with pytest.raises(ValueError, match="Pattern cannot be empty"):
        ParallelPatternMatcher([])
    with pytest.raises(ValueError, match="Start pattern cannot be empty"):
        RangePatternMatcher([], [1])
    with pytest.raises(ValueError, match="End pattern cannot be empty"):
        RangePatternMatcher([1], ())


def test_patterns_longer_than_five_are_accepted() -> None:
    # Upstream's docstring mentions a limit of five that its code does not enforce.
    pattern = list(range(12))
    assert ParallelPatternMatcher(pattern).match([9, *pattern, *pattern]) == [1, 13]
    assert RangePatternMatcher(pattern, pattern).match(pattern * 3) == [(0, 24)]


class Tokens(Sequence[int]):
    """A sequence that is neither a list nor a tuple (and holds no buffer)."""

    def __init__(self, *items: int) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int) -> int:  # type: ignore[override]
        return self._items[index]


def test_any_integer_sequence_is_accepted() -> None:
    matcher = ParallelPatternMatcher(pattern=Tokens(2, 3))
    assert matcher.match(data=range(6)) == [2]
    assert matcher.match(Tokens(3, 2, 3)) == [1]
    # A buffer of C ints is read element by element, not as raw bytes.
    assert matcher.match(array("q", [2, 3, 2, 3])) == [0, 2]
    assert RangePatternMatcher(start_pattern=(True,), end_pattern=[3]).match([1, 2, 3]) == [(0, 3)]
    assert ParallelPatternMatcher([INT_MIN, INT_MAX]).match([0, INT_MIN, INT_MAX]) == [1]


def test_the_iterables_pybind11_converts_are_accepted() -> None:
    # pybind11 3.0 (torch 2.13's, which upstream builds with) also converts these,
    # consuming them whole; a bytearray is a sequence of its byte values.
    matcher = ParallelPatternMatcher(k for k in (2, 3))
    assert matcher.match(map(int, "12323")) == [1, 3]
    assert matcher.match(zip()) == []  # a zip yields tuples: only an empty one converts
    assert matcher.match(bytearray(b"\x02\x03")) == [0]
    assert matcher.match(memoryview(b"\x00\x02\x03")) == [1]
    assert ParallelPatternMatcher({7}).match(frozenset({7})) == [0]
    keyed = {2: "a", 3: "b"}
    assert matcher.match(keyed.keys()) == [0]
    assert RangePatternMatcher(keyed.keys(), {9: 2}.values()).match([2, 3, 0, 2]) == [(0, 4)]


def _bad_vectors() -> Iterator[object]:
    yield "123"
    yield b"\x01\x00\x00\x00"
    yield {1: 1}
    yield iter([1, 2])  # an iterator that is neither a generator nor a sequence
    yield None
    yield 3
    yield [1, 2.0]
    yield [1, "2"]
    yield [None]
    yield [INT_MAX + 1]
    yield [INT_MIN - 1]


@pytest.mark.parametrize("bad", list(_bad_vectors()), ids=repr)
def test_what_is_no_int_vector_is_a_type_error(bad: object) -> None:
    # pybind11 refuses to convert these to std::vector<int>: TypeError, as upstream.
    with pytest.raises(TypeError):
        ParallelPatternMatcher(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ParallelPatternMatcher([1]).match(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RangePatternMatcher(bad, [1])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RangePatternMatcher([1], bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        RangePatternMatcher([1], [2]).match(bad)  # type: ignore[arg-type]


def test_one_matcher_shared_by_threads() -> None:
    parallel = ParallelPatternMatcher([1, 2])
    ranged = RangePatternMatcher([1], [2])
    inputs = [[(n * k) % 4 for k in range(300 + n)] for n in range(16)]
    errors: list[str] = []

    def check(data: list[int]) -> None:
        for _ in range(20):
            if parallel.match(data) != naive_positions([1, 2], data):
                errors.append(f"parallel on {data[:8]}...")
            if ranged.match(data) != naive_ranges([1], [2], data):
                errors.append(f"range on {data[:8]}...")

    threads = [threading.Thread(target=check, args=(data,)) for data in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_repr_shows_the_patterns() -> None:
    assert repr(ParallelPatternMatcher((4, -5))) == "ParallelPatternMatcher(pattern=[4, -5])"
    assert repr(RangePatternMatcher([1], [2, 3])) == (
        "RangePatternMatcher(start_pattern=[1], end_pattern=[2, 3])"
    )


def test_native_module_reexports_them() -> None:
    from lmcache import lmcache_native
    from lmcache.v1 import native_compat

    assert lmcache_native.ParallelPatternMatcher is native_compat.ParallelPatternMatcher
    assert lmcache_native.ParallelPatternMatcher is ParallelPatternMatcher
    assert lmcache_native.RangePatternMatcher is native_compat.RangePatternMatcher
    assert lmcache_native.RangePatternMatcher is RangePatternMatcher
