"""Parsers and checks for config values: the building blocks of the key table.

A parser takes ``(raw value, from_env)`` and returns the typed value, raising
``ValueError`` with the reason; a check takes the parsed value and returns ``None`` when it
is fine, else the reason.  Values from the environment are strings, so some parsers accept
more spellings there (``none``/``null`` for an optional value, YAML for lists and mappings).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from lmcache.utils import parse_size

# ---------------------------------------------------------------------------------------
# Value parsers: (raw value, from_env) -> typed value, raising ValueError with the reason
# ---------------------------------------------------------------------------------------


def parse_bool(value: Any, from_env: bool) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
    raise ValueError("expected a boolean (true/false)")


def parse_int(value: Any, from_env: bool) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError("expected an integer")


def parse_float(value: Any, from_env: bool) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number")
    if isinstance(value, int | float):
        result = float(value)
    else:
        try:
            result = float(str(value).strip())
        except ValueError:
            raise ValueError("expected a number") from None
    if math.isnan(result):
        raise ValueError("expected a number, got NaN")
    return result


def parse_size_gb(value: Any, from_env: bool) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a size (GB number or e.g. '10GB', '512MiB')")
    try:
        return parse_size(value, default_unit="GB") / 1024**3
    except ValueError as exc:
        raise ValueError(f"expected a size (GB number or e.g. '10GB', '512MiB'): {exc}") from None


def parse_str(value: Any, from_env: bool) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ValueError("expected a string")


def optional(parser: Callable[[Any, bool], Any]) -> Callable[[Any, bool], Any]:
    def parse(value: Any, from_env: bool) -> Any:
        if value is None:
            return None
        if from_env and isinstance(value, str) and value.strip().lower() in ("", "none", "null"):
            return None
        return parser(value, from_env)

    return parse


def parse_str_list(value: Any, from_env: bool) -> list[str]:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            value = yaml.safe_load(text)
        else:
            return [item.strip() for item in text.split(",") if item.strip()]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError("expected a list of strings (or a comma-separated string)")


def parse_int_list(value: Any, from_env: bool) -> list[int]:
    items = parse_str_list(value, from_env) if isinstance(value, str) else value
    if isinstance(items, list | tuple):
        return [parse_int(v, from_env) for v in items]
    raise ValueError("expected a list of integers")


def parse_dict(value: Any, from_env: bool) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ValueError("expected a mapping (JSON/YAML object)") from None
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return dict(value)
    raise ValueError("expected a mapping with string keys")


def parse_any(value: Any, from_env: bool) -> Any:
    if from_env and isinstance(value, str):
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    return value


# ---------------------------------------------------------------------------------------
# Checks on parsed values: return None when fine, else the reason
# ---------------------------------------------------------------------------------------

Check = Callable[[Any], str | None]


def positive(v: Any) -> str | None:
    return None if v is None or v > 0 else "must be > 0"


def non_negative(v: Any) -> str | None:
    return None if v is None or v >= 0 else "must be >= 0"


def ratio(v: Any) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be between 0 and 1"


def port(v: Any) -> str | None:
    return None if v is None or 0 < v < 65536 else "must be a TCP port (1-65535)"


def one_of(choices: tuple[str, ...], case_insensitive: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if v is None:
            return None
        probe = v.upper() if case_insensitive else v
        return None if probe in choices else f"must be one of {', '.join(choices)}"

    return check


@dataclass(frozen=True)
class KeySpec:
    """How one key parses its raw value, and the check on the parsed value."""

    parse: Callable[[Any, bool], Any]
    check: Check | None = None
