"""Integer-sequence pattern matchers with upstream LMCache 0.5.6's ``lmcache_native`` API.

Upstream builds ``ParallelPatternMatcher`` and ``RangePatternMatcher`` in C++ (over
``std::vector<int>``, behind pybind11) as general helpers for finding marker sequences
in token ids; upstream's own package does not call them yet, its tests do.  These are
pure-Python equivalents with the same results:

* ``ParallelPatternMatcher(pattern).match(data)`` is every start position of ``pattern``
  in ``data``, ascending, overlapping occurrences included (``[1, 1]`` in ``[1, 1, 1]`` is
  ``[0, 1]``);
* ``RangePatternMatcher(start_pattern, end_pattern).match(data)`` scans left to right:
  at the first occurrence of ``start_pattern`` it takes the first ``end_pattern`` that
  begins after the start pattern ends (the two never overlap), records
  ``(start_pos, end_pos)`` with ``end_pos`` exclusive (just past the end pattern) and
  resumes at ``end_pos``; a start pattern inside a recorded range is not a new start,
  and once a start finds no end the scan is over (no later start could find one);
* an empty pattern is a ``ValueError`` when the matcher is made (upstream's docstring
  also mentions a five-element limit that its code does not enforce; neither do we);
* patterns and data are converted as pybind11 converts them to ``std::vector<int>``:
  any sequence but ``str`` / ``bytes`` (a ``bytearray`` is its byte values), or a
  generator, set, dict view, ``map`` or ``zip`` (consumed whole), of integers that fit a
  C ``int`` (32 bits, ``bool`` and NumPy integers included); anything else is a
  ``TypeError``.  (pybind11 also truncates non-``float`` numbers such as
  ``numpy.float32(2.7)`` to an int; here any non-integer is refused.)

How: each sequence is packed into native 32-bit integers (``array('i')``), and the
search is ``bytes.find`` over the packed bytes, so the scan runs in C.  A byte-level hit
counts only when it starts on an element boundary; a misaligned one is skipped by
resuming at the next boundary.  A matcher holds only its packed patterns and never
changes after it is made, so one instance may be used from many threads at once.
"""

from __future__ import annotations

import types
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

__all__ = ["ParallelPatternMatcher", "RangePatternMatcher"]

# std::vector<int>: a C int is 32 bits on every platform lmcache runs on; array('i') is
# the same C type, so it refuses exactly the values pybind11 would.
_TYPECODE = "i"
_WIDTH = array(_TYPECODE).itemsize
# Iterables that are no sequences but that the pybind11 bundled with torch 2.13 (3.0,
# which upstream's wheels are built with) still converts to a std::vector.
_ONE_PASS_ITERABLES: tuple[type, ...] = (
    types.GeneratorType,
    set,
    frozenset,
    type({}.keys()),
    type({}.values()),
    type({}.items()),
    map,
    zip,
)


def _pack(values: object, name: str) -> bytes:
    """``values`` as packed C ints, or the ``TypeError`` pybind11 raises when it cannot
    convert them to ``std::vector<int>``."""
    items: Sequence[object]
    if isinstance(values, (list, tuple)):
        items = values
    elif isinstance(values, _ONE_PASS_ITERABLES):
        # pybind11 takes these too, consuming them whole (as tuple(values) would).
        items = tuple(cast("Iterable[object]", values))
    elif (
        isinstance(values, (str, bytes, Mapping))
        or not hasattr(type(values), "__getitem__")
        or not hasattr(type(values), "__len__")
    ):
        raise TypeError(f"{name} must be a sequence of integers, not {type(values).__name__}")
    else:
        # array() would read a buffer (a bytearray, a NumPy array) as raw bytes rather than
        # as elements; a list converts element by element, as pybind11 does.
        items = list(cast("Iterable[object]", values))
    try:
        return array(_TYPECODE, items).tobytes()
    except (TypeError, OverflowError) as exc:
        raise TypeError(f"{name} must hold integers that fit a C int (32 bits): {exc}") from None


def _find(haystack: bytes, needle: bytes, start: int) -> int:
    """Element index of the first occurrence of ``needle`` at element ``start`` or later,
    or -1.  Both are packed C ints; a byte match off an element boundary is not one."""
    offset = haystack.find(needle, start * _WIDTH)
    while offset >= 0:
        misalignment = offset % _WIDTH
        if misalignment == 0:
            return offset // _WIDTH
        offset = haystack.find(needle, offset - misalignment + _WIDTH)
    return -1


class ParallelPatternMatcher:
    """Finds every (possibly overlapping) occurrence of one integer pattern."""

    __slots__ = ("_length", "_needle")

    def __init__(self, pattern: Sequence[int]) -> None:
        self._needle = _pack(pattern, "pattern")
        if not self._needle:
            raise ValueError("Pattern cannot be empty")
        self._length = len(self._needle) // _WIDTH

    def match(self, data: Sequence[int]) -> list[int]:
        """Every position of ``data`` where the pattern starts, ascending."""
        haystack = _pack(data, "data")
        positions: list[int] = []
        position = _find(haystack, self._needle, 0)
        while position >= 0:
            positions.append(position)
            # Overlapping occurrences count: resume one element on, not past the match.
            position = _find(haystack, self._needle, position + 1)
        return positions

    def __repr__(self) -> str:
        return f"ParallelPatternMatcher(pattern={array(_TYPECODE, self._needle).tolist()})"


class RangePatternMatcher:
    """Finds ``start_pattern ... end_pattern`` ranges, each closed by its first end."""

    __slots__ = ("_end", "_end_length", "_start", "_start_length")

    def __init__(self, start_pattern: Sequence[int], end_pattern: Sequence[int]) -> None:
        self._start = _pack(start_pattern, "start_pattern")
        self._end = _pack(end_pattern, "end_pattern")
        if not self._start:
            raise ValueError("Start pattern cannot be empty")
        if not self._end:
            raise ValueError("End pattern cannot be empty")
        self._start_length = len(self._start) // _WIDTH
        self._end_length = len(self._end) // _WIDTH

    def match(self, data: Sequence[int]) -> list[tuple[int, int]]:
        """``(start_pos, end_pos)`` of each range, left to right, ``end_pos`` exclusive."""
        haystack = _pack(data, "data")
        ranges: list[tuple[int, int]] = []
        resume = 0
        while True:
            start = _find(haystack, self._start, resume)
            if start < 0:
                break
            end = _find(haystack, self._end, start + self._start_length)
            if end < 0:
                # Every later start would search a suffix of this span: no end there either.
                break
            resume = end + self._end_length
            ranges.append((start, resume))
        return ranges

    def __repr__(self) -> str:
        start = array(_TYPECODE, self._start).tolist()
        end = array(_TYPECODE, self._end).tolist()
        return f"RangePatternMatcher(start_pattern={start}, end_pattern={end})"
