"""Upstream's ``--l1-manager`` JSON, read into the settings of our one L1.

Upstream 0.5.6 lets an operator describe each L1 as a tagged JSON object (``type`` DRAM,
DEVDAX or GDS).  Our server has one L1 in host memory, so one DRAM object maps onto it;
DEVDAX and GDS need hardware this server does not drive and are refused with that reason,
and so is a second L1.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["L1ManagerSpec", "parse_l1_managers"]

_COMMON_FIELDS = {
    "type",
    "tag",
    "size_gb",
    "align_bytes",
    "eviction",
    "read_ttl_seconds",
    "write_ttl_seconds",
}
_DRAM_FIELDS = _COMMON_FIELDS | {"use_lazy", "init_size_gb", "shm_name", "use_hugepages"}
_EVICTION_FIELDS = {"eviction_policy", "trigger_watermark", "eviction_ratio"}
_REFUSED_TYPES = {
    "DEVDAX": "Device-DAX L1 needs a /dev/dax device, which this server does not drive",
    "GDS": "GPUDirect-Storage L1 needs cuFile/hipFile, which this server does not use",
}


@dataclass(frozen=True)
class L1ManagerSpec:
    """One DRAM ``--l1-manager``: the values it sets (None: keep the flag's value)."""

    tag: str
    size_gb: float
    align_bytes: int | None = None
    use_lazy: bool | None = None
    init_size_gb: float | None = None
    use_hugepages: bool | None = None
    shm_name: str | None = None
    read_ttl_seconds: int | None = None
    write_ttl_seconds: int | None = None
    eviction_policy: str | None = None
    trigger_watermark: float | None = None
    eviction_ratio: float | None = None


def parse_l1_managers(raws: list[str]) -> L1ManagerSpec | None:
    """The one DRAM L1 the ``--l1-manager`` values describe (None when none is given);
    ``ValueError`` with a one-line reason for anything else."""
    if not raws:
        return None
    if len(raws) > 1:
        raise ValueError(
            f"--l1-manager given {len(raws)} times: this server has one L1 (host memory)"
        )
    return _parse_one(raws[0])


def _parse_one(raw: str) -> L1ManagerSpec:
    try:
        values = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--l1-manager {raw!r} is not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise ValueError(f"--l1-manager {raw!r} must be a JSON object")
    kind = values.get("type")
    if kind in _REFUSED_TYPES:
        raise ValueError(f"--l1-manager type {kind} is refused: {_REFUSED_TYPES[kind]}")
    if kind != "DRAM":
        raise ValueError(f"--l1-manager needs type DRAM (DEVDAX and GDS are refused), got {kind!r}")
    unknown = set(values) - _DRAM_FIELDS
    if unknown:
        raise ValueError(f"--l1-manager: unknown fields {sorted(unknown)}")
    tag = values.get("tag")
    if not isinstance(tag, str) or not tag.strip():
        raise ValueError("--l1-manager: tag must be a non-empty string")
    eviction = values.get("eviction", {})
    if not isinstance(eviction, dict) or set(eviction) - _EVICTION_FIELDS:
        raise ValueError(
            "--l1-manager: eviction may hold only eviction_policy, trigger_watermark "
            "and eviction_ratio"
        )
    policy = eviction.get("eviction_policy")
    if policy is not None and not isinstance(policy, str):
        raise ValueError("--l1-manager: eviction_policy must be a string")
    shm_name = values.get("shm_name")
    if shm_name is not None and not isinstance(shm_name, str):
        raise ValueError("--l1-manager: shm_name must be a string")
    return L1ManagerSpec(
        tag=tag,
        size_gb=_number(values, "size_gb", required=True) or 0.0,
        align_bytes=_int(values, "align_bytes"),
        use_lazy=_bool(values, "use_lazy"),
        init_size_gb=_number(values, "init_size_gb"),
        use_hugepages=_bool(values, "use_hugepages"),
        shm_name=shm_name,
        read_ttl_seconds=_int(values, "read_ttl_seconds"),
        write_ttl_seconds=_int(values, "write_ttl_seconds"),
        eviction_policy=policy.upper() if policy is not None else None,
        trigger_watermark=_fraction(eviction, "trigger_watermark"),
        eviction_ratio=_fraction(eviction, "eviction_ratio"),
    )


def _number(values: dict[str, Any], name: str, required: bool = False) -> float | None:
    value = values.get(name)
    if value is None and not required:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"--l1-manager: {name} must be a finite positive number")
    return float(value)


def _int(values: dict[str, Any], name: str) -> int | None:
    value = values.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"--l1-manager: {name} must be a positive integer")
    return value


def _bool(values: dict[str, Any], name: str) -> bool | None:
    value = values.get(name)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"--l1-manager: {name} must be true or false")
    return value


def _fraction(values: dict[str, Any], name: str) -> float | None:
    value = values.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"--l1-manager: {name} must be in (0, 1]")
    return float(value)
