"""Validators of the ``lmcache server`` flags (argparse ``type=``).

A ``--config`` file's values and :meth:`MPServerConfig.validate` go through the very same
functions, so a bad port or size is one error message naming the flag wherever it came from.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmcache.v1.config.keys import canonical_cache_policy

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _number(text: str, kind: Callable[[str], Any], what: str) -> Any:
    try:
        return kind(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def tcp_port(text: str) -> int:
    """A TCP port, 1-65535 (0 would bind a random port while announcing another)."""
    port = _number(text, int, "an integer port")
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1-65535)")
    return int(port)


def tcp_port_or_off(text: str) -> int:
    """A TCP port, or 0 to turn the endpoint off."""
    port = _number(text, int, "an integer port")
    if port != 0 and not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1-65535, or 0 for off)")
    return int(port)


def positive_int(text: str) -> int:
    value = _number(text, int, "an integer")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return int(value)


def non_negative_int(text: str) -> int:
    value = _number(text, int, "an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return int(value)


def positive_float(text: str) -> float:
    value = _number(text, float, "a number")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number > 0")
    return float(value)


def non_negative_float(text: str) -> float:
    value = _number(text, float, "a number")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number >= 0")
    return float(value)


def unit_fraction(text: str) -> float:
    """A fraction in (0, 1] (a watermark or a ratio of L1)."""
    value = _number(text, float, "a number")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} must be in (0, 1]")
    return float(value)


def power_of_two(text: str) -> int:
    """A positive power of two (an alignment in bytes)."""
    value = _number(text, int, "an integer")
    if value <= 0 or value & (value - 1):
        raise argparse.ArgumentTypeError(f"{value} must be a positive power of two")
    return int(value)


def log_level(text: str) -> str:
    level = str(text).strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown log level {text!r}; choose from {', '.join(LOG_LEVELS)}"
        )
    return level


def usable_directory(text: str) -> str:
    """A directory we can write into, or one we can create (its nearest parent is)."""
    path = Path(str(text)).expanduser()
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"directory {text!r} is not writable")
        return str(text)
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(
            f"{text!r} does not exist and cannot be created ({parent} is not writable)"
        )
    return str(text)


def upper_case(text: str) -> str:
    return str(text).upper()


def eviction_policy_name(text: str) -> str:
    """A policy name in any case, as its canonical spelling (``arc`` -> ``ARC``,
    ``isolatedlru`` -> ``IsolatedLRU``); an unknown name is returned as given so that
    argparse's ``choices`` check names the valid ones."""
    try:
        return canonical_cache_policy(text)
    except ValueError:
        return str(text)
