"""``lmcache.v1.utils.json_utils`` (upstream 0.5.6's names): what upstream's tests do not
cover -- sets, keys JSON cannot hold, nested dataclasses, and that the result dumps."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lmcache.v1.utils.json_utils import make_json_safe, safe_asdict


class _Colour(enum.Enum):
    RED = 1


@dataclass
class _Inner:
    where: Path = Path("/data")


@dataclass
class _Outer:
    inner: _Inner = field(default_factory=_Inner)
    tags: frozenset[str] = frozenset({"x"})
    by_path: dict[Path, int] = field(default_factory=lambda: {Path("/a"): 1})


def test_sets_become_lists_and_odd_keys_strings() -> None:
    assert make_json_safe({"s": {3}, Path("/k"): (1,), 2: None}) == {
        "s": [3],
        "/k": [1],
        2: None,
    }


def test_unknown_values_become_their_str() -> None:
    assert make_json_safe(_Colour.RED) == "_Colour.RED"
    assert make_json_safe(b"\x00") == "b'\\x00'"


def test_nested_dataclass_dumps() -> None:
    result = safe_asdict(_Outer())
    assert result == {"inner": {"where": "/data"}, "tags": ["x"], "by_path": {"/a": 1}}
    assert json.loads(json.dumps(result)) == result


def test_scalars_keep_their_identity() -> None:
    value = 10**30
    assert make_json_safe(value) is value
    assert make_json_safe(True) is True


def test_dataclass_type_is_refused() -> None:
    with pytest.raises(TypeError, match="Expected a dataclass instance, got type"):
        safe_asdict(_Outer)
