"""Checking config keys and values: conversions, error messages, strict mode, YAML files."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

import yaml

from lmcache.v1.config.keys import IMPLEMENTED_KEYS, KEYS, NO_EFFECT_HINTS, canonical_cache_policy

ENV_PREFIX = "LMCACHE_"
CONFIG_FILE_ENV = "LMCACHE_CONFIG_FILE"
STRICT_ENV = "LMCACHE_STRICT_CONFIG"


class ConfigError(ValueError):
    """A configuration key has a bad value, or is unknown."""


def describe_source(source: str) -> str:
    return f" (from {source})" if source else ""


def config_keys() -> list[str]:
    """Every typed key :class:`LMCacheEngineConfig` accepts (implemented or not)."""
    return list(KEYS)


def is_implemented(key: str) -> bool:
    """Whether something in this core reads ``key`` (see :data:`IMPLEMENTED_KEYS`)."""
    return key in IMPLEMENTED_KEYS


def no_effect_message(key: str, source: str = "") -> str:
    hint = NO_EFFECT_HINTS.get(key)
    return f"config key {key!r}{describe_source(source)} has no effect in lmcache-core" + (
        f"; {hint}" if hint else ""
    )


def strict_mode(strict: bool | None, environ: Mapping[str, str] | None = None) -> bool:
    """The explicit argument, else ``LMCACHE_STRICT_CONFIG`` (1/true/yes/on)."""
    if strict is not None:
        return strict
    env = os.environ if environ is None else environ
    raw = env.get(STRICT_ENV, os.environ.get(STRICT_ENV, ""))
    return raw.strip().lower() in ("1", "true", "yes", "on")


def convert_value(key: str, raw: Any, source: str, from_env: bool) -> Any:
    spec = KEYS[key]
    try:
        value = spec.parse(raw, from_env)
        reason = spec.check(value) if spec.check is not None else None
    except (ValueError, TypeError) as exc:
        reason = str(exc)
    if reason is not None:
        raise ConfigError(
            f"invalid value for config key {key!r}{describe_source(source)}: {raw!r} ({reason})"
        )
    if key == "cache_policy":
        value = canonical_cache_policy(value)
    return value


def unknown_key_message(key: str, source: str) -> str:
    close = difflib.get_close_matches(str(key), list(KEYS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown config key {key!r}{describe_source(source)}{hint}"


def read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {os.fspath(path)!r}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {os.fspath(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {os.fspath(path)!r} must contain a mapping")
    return data
