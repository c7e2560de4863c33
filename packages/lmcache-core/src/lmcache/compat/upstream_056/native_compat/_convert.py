"""Argument conversion as upstream's pybind11 bindings do it for C++ unsigned integers."""

from __future__ import annotations

import operator


def as_unsigned(value: object, name: str, bits: int) -> int:
    """``value`` as a C++ unsigned integer of ``bits`` bits (``size_t``: 64, ``uint32_t``:
    32), or the ``TypeError`` pybind11 raises when it cannot convert it."""
    if isinstance(value, float):
        # operator.index refuses floats already; the check only makes the message clear.
        raise TypeError(f"{name} must be a non-negative integer, not float")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{name} must be a non-negative integer, not {type(value).__name__}"
        ) from None
    if not 0 <= number < (1 << bits):
        raise TypeError(f"{name} must be a non-negative integer below 2**{bits}, got {number}")
    return number
