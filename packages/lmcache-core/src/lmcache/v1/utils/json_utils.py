"""Upstream LMCache 0.5.6's ``lmcache.v1.utils.json_utils``: turn configuration values
(dataclasses holding paths, enums, nested containers) into plain JSON values.

Used by the ``GET /config`` route (:mod:`lmcache.compat.upstream_056.http_apis.config_api`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["make_json_safe", "safe_asdict"]

_JSON_SCALARS = (str, int, float, bool, type(None))


def make_json_safe(obj: Any) -> Any:
    """``obj`` as nested ``dict`` / ``list`` / JSON scalars.

    Mappings and sequences (lists, tuples, sets) are converted element by element; JSON
    scalars come back as they are (the same object, so ``bool`` stays ``bool``); anything
    else becomes ``str(obj)`` (a ``Path`` its path, an object its ``__str__``).  Mapping
    keys that JSON cannot hold become their ``str``.
    """
    if isinstance(obj, _JSON_SCALARS):
        return obj
    if isinstance(obj, dict):
        return {
            key if isinstance(key, _JSON_SCALARS) else str(key): make_json_safe(value)
            for key, value in obj.items()
        }
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [make_json_safe(item) for item in obj]
    return str(obj)


def safe_asdict(obj: Any) -> dict[str, Any]:
    """The fields of the dataclass instance ``obj`` (nested dataclasses included), made
    JSON-safe by :func:`make_json_safe`.

    Raises:
        TypeError: ``obj`` is not a dataclass instance (a dataclass type is refused too).
    """
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"Expected a dataclass instance, got {type(obj).__name__}")
    result: dict[str, Any] = make_json_safe(dataclasses.asdict(obj))
    return result
