"""A fixed-size bitmap with upstream LMCache 0.5.6's ``lmcache_native.Bitmap`` API.

Upstream builds ``Bitmap`` in C++ (a byte vector behind pybind11); an L2 adapter
(:class:`~lmcache.v1.storage_backend.l2_adapters.base.L2AdapterInterface`) answers lookups
and loads with one, a bit per key of the batch, so it is part of that public interface and
lives beside it.  ``lmcache.lmcache_native.Bitmap`` is this same class.  It is a pure-Python
equivalent: the bits live in one Python ``int`` (bit ``i`` of the integer is position
``i`` of the bitmap), so the set algebra, population count and scans run in C inside
the interpreter rather than in a per-bit Python loop.

Semantics kept from upstream, because callers rely on them:

* positions at or past ``size`` are silently ignored by ``set`` / ``clear`` /
  ``batched_set`` / ``set_range`` and read as clear by ``test`` (no ``IndexError``);
* ``a & b`` and ``a | b`` of different sizes have the smaller size (the longer operand
  is truncated), ``~a`` keeps the size and never sets a position past it;
* "leading" means from position 0 upwards (``count_leading_zeros`` is the index of the
  first set bit, or ``size`` when none is set), and ``repr`` writes position 0 first;
* a negative or non-integer position or size is a ``TypeError``, as pybind11 raises
  when it cannot convert the argument to ``size_t``.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["Bitmap"]

_T = TypeVar("_T")
_SIZE_T_LIMIT = 1 << 64


def _as_size_t(value: object, name: str) -> int:
    """``value`` as a C++ ``size_t``, or the ``TypeError`` pybind11 raises when it cannot
    convert it (a float, a non-integer, a negative or too large number)."""
    if isinstance(value, float):
        raise TypeError(f"{name} must be a non-negative integer, not float")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{name} must be a non-negative integer, not {type(value).__name__}"
        ) from None
    if not 0 <= number < _SIZE_T_LIMIT:
        raise TypeError(f"{name} must be a non-negative integer below 2**64, got {number}")
    return number


class Bitmap:
    """``size`` bits, all clear, or the first ``prefix_bits`` of them set (clamped to size)."""

    __slots__ = ("_bits", "_size")

    def __init__(self, size: int, prefix_bits: int | None = None) -> None:
        self._size = _as_size_t(size, "size")
        prefix = 0 if prefix_bits is None else _as_size_t(prefix_bits, "prefix_bits")
        self._bits = (1 << min(prefix, self._size)) - 1

    @classmethod
    def _from_bits(cls, size: int, bits: int) -> Bitmap:
        # Internal constructor: ``bits`` must already be below ``1 << size``.
        bitmap = cls.__new__(cls)
        bitmap._size = size
        bitmap._bits = bits
        return bitmap

    def _full_mask(self) -> int:
        return (1 << self._size) - 1

    # -- single bits -------------------------------------------------------------------

    def set(self, index: int) -> None:
        """Set position ``index`` to 1 (a position at or past ``size`` is ignored)."""
        position = _as_size_t(index, "index")
        if position < self._size:
            self._bits |= 1 << position

    def clear(self, index: int) -> None:
        """Clear position ``index`` to 0 (a position at or past ``size`` is ignored)."""
        position = _as_size_t(index, "index")
        if position < self._size:
            self._bits &= ~(1 << position)

    def test(self, index: int) -> bool:
        """Whether position ``index`` is set (a position at or past ``size`` reads clear)."""
        position = _as_size_t(index, "index")
        return position < self._size and bool((self._bits >> position) & 1)

    def batched_set(self, indices: Iterable[int]) -> None:
        """Set every position in ``indices`` (positions at or past ``size`` ignored).

        All indices are converted before any bit changes, so a bad one leaves the bitmap
        as it was (upstream converts the whole list before the call, too).
        """
        if isinstance(indices, (str, bytes, bytearray, Mapping)):
            raise TypeError(f"indices must be a sequence of integers, not {type(indices).__name__}")
        positions = [_as_size_t(index, "indices[i]") for index in indices]
        mask = 0
        for position in positions:
            if position < self._size:
                mask |= 1 << position
        self._bits |= mask

    def set_range(self, start: int, end: int) -> None:
        """Set every position in the half-open range ``[start, end)``, ``end`` clamped to
        ``size``; an empty or out-of-range range changes nothing."""
        first = _as_size_t(start, "start")
        stop = min(_as_size_t(end, "end"), self._size)
        if first < stop:
            self._bits |= ((1 << (stop - first)) - 1) << first

    # -- whole-bitmap queries ------------------------------------------------------------

    def copy(self) -> Bitmap:
        """An independent bitmap with the same size and bits."""
        return Bitmap._from_bits(self._size, self._bits)

    def size(self) -> int:
        """Number of bits in the bitmap."""
        return self._size

    def __len__(self) -> int:
        return self._size

    def popcount(self) -> int:
        """Number of set positions."""
        return self._bits.bit_count()

    def count_leading_zeros(self) -> int:
        """Clear positions before the first set one, counting from position 0 (``size``
        when none is set)."""
        if self._bits == 0:
            return self._size
        # bits & -bits isolates the lowest set bit; its bit_length is its index + 1.
        return (self._bits & -self._bits).bit_length() - 1

    def count_leading_ones(self) -> int:
        """Set positions before the first clear one, counting from position 0."""
        return (~self).count_leading_zeros()

    def highest_set_bit(self) -> int:
        """Index of the highest set position, or -1 when none is set."""
        return self._bits.bit_length() - 1

    def get_indices_list(self) -> list[int]:
        """The set positions in ascending order."""
        # One pass of str.find over the binary text (position 0 first) keeps the Python
        # loop to one iteration per set bit; peeling bits off the int would copy it each time.
        text = format(self._bits, "b")[::-1]
        indices: list[int] = []
        position = text.find("1")
        while position >= 0:
            indices.append(position)
            position = text.find("1", position + 1)
        return indices

    # builtins.set: inside the class body the name ``set`` is the method above.
    def get_indices_set(self) -> builtins.set[int]:
        """The set positions as a set."""
        return builtins.set(self.get_indices_list())

    def gather(self, items: Sequence[_T]) -> list[_T]:
        """``items[i]`` for every set position ``i`` below ``len(items)``, in order."""
        # Upstream takes any Python sequence (list, tuple, ...): indexable with a length,
        # not a mapping or an unordered collection.
        kind = type(items)
        if isinstance(items, Mapping) or not (
            hasattr(kind, "__getitem__") and hasattr(kind, "__len__")
        ):
            raise TypeError(f"items must be a sequence, not {kind.__name__}")
        length = len(items)
        return [items[index] for index in self.get_indices_list() if index < length]

    # -- algebra ---------------------------------------------------------------------

    def __and__(self, other: Any) -> Bitmap:
        if not isinstance(other, Bitmap):
            return NotImplemented
        size = min(self._size, other._size)
        return Bitmap._from_bits(size, self._bits & other._bits & ((1 << size) - 1))

    def __or__(self, other: Any) -> Bitmap:
        if not isinstance(other, Bitmap):
            return NotImplemented
        size = min(self._size, other._size)
        return Bitmap._from_bits(size, (self._bits | other._bits) & ((1 << size) - 1))

    def __invert__(self) -> Bitmap:
        return Bitmap._from_bits(self._size, ~self._bits & self._full_mask())

    def __repr__(self) -> str:
        """One character per position, position 0 first: ``'1'`` set, ``'0'`` clear."""
        if self._size == 0:
            return ""
        # bin() writes the highest position first; pad to size, then reverse.
        return format(self._bits, f"0{self._size}b")[::-1]
