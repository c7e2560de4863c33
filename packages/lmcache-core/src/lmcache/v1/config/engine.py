"""``LMCacheEngineConfig``: the typed engine configuration and how it is loaded.

Precedence, lowest first: built-in defaults, the YAML file (an explicit path, else
``LMCACHE_CONFIG_FILE``), then ``LMCACHE_<KEY_UPPER>`` environment variables.  Parsing and
checking live in :mod:`lmcache.v1.config.validation`, the key table in
:mod:`lmcache.v1.config.keys`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lmcache.v1.config.keys import IMPLEMENTED_KEYS, KEYS, UPSTREAM_UNUSED_KEYS
from lmcache.v1.config.validation import (
    CONFIG_FILE_ENV,
    ENV_PREFIX,
    STRICT_ENV,
    ConfigError,
    convert_value,
    describe_source,
    no_effect_message,
    read_yaml,
    strict_mode,
    unknown_key_message,
)

logger = logging.getLogger(__name__)


@dataclass
class LMCacheEngineConfig:
    """Engine configuration; every field is one upstream key with the upstream default."""

    chunk_size: int = 256
    local_cpu: bool = True
    max_local_cpu_size: float = 5.0
    local_cpu_use_hugepages: bool = False
    reserve_local_cpu_size: float = 0.0
    local_disk: str | None = None
    local_disk_path_sharding: str = "by_gpu"
    max_local_disk_size: float = 0.0
    remote_url: str | None = None
    remote_serde: str = "naive"
    save_unfull_chunk: bool = False
    blocking_timeout_secs: int = 10
    cache_policy: str = "LRU"
    storage_plugins: list[str] | None = None
    remote_storage_plugins: list[str] | None = None
    extra_config: dict[str, Any] | None = None
    use_layerwise: bool = False
    save_decode_cache: bool = False
    pre_caching_hash_algorithm: str = "builtin"
    retrieve_locations: list[str] | None = None
    store_location: str | None = None
    gds_path: str | None = None
    gds_path_sharding: str = "by_gpu"
    gds_buffer_size: int | None = None
    use_gds: bool = True
    gds_backend: str = "cufile"
    maru_path: str | None = None
    maru_pool_size: float = 4.0
    numa_mode: str | None = None
    enable_async_loading: bool = False
    enable_lazy_memory_allocator: bool = False
    lazy_memory_initial_ratio: float = 0.2
    lazy_memory_expand_trigger_ratio: float = 0.5
    lazy_memory_step_ratio: float = 0.1
    lazy_memory_safe_size: float = 0.0
    priority_limit: int | None = None
    min_retrieve_tokens: int = 0
    lookup_timeout_ms: int = 3000
    pin_timeout_sec: int = 300
    pin_check_interval_sec: int = 30
    mp_host: str | None = None
    mp_port: int = 5555
    enable_hidden_state_cache: bool = False
    max_hidden_state_cpu_size: float = 2.0
    unused_upstream_keys: dict[str, Any] = field(default_factory=dict, repr=False)
    ignored_keys: dict[str, Any] = field(default_factory=dict, repr=False)

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def from_defaults(cls, **overrides: Any) -> LMCacheEngineConfig:
        """Defaults plus keyword overrides (validated; no file, no environment)."""
        return cls.from_dict(overrides, source="keyword argument")

    @classmethod
    def from_dict(
        cls, values: Mapping[str, Any], source: str = "", strict: bool | None = None
    ) -> LMCacheEngineConfig:
        config = cls()
        config.apply(values, source=source, strict=strict)
        return config

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], strict: bool | None = None
    ) -> LMCacheEngineConfig:
        """Defaults plus the YAML file (no environment)."""
        config = cls()
        config.apply(read_yaml(path), source=str(path), strict=strict)
        return config

    @classmethod
    def from_env(cls, strict: bool | None = None) -> LMCacheEngineConfig:
        """Defaults plus ``LMCACHE_<KEY>`` environment variables."""
        config = cls()
        config.update_from_env(strict=strict)
        return config

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | None = None, strict: bool | None = None
    ) -> LMCacheEngineConfig:
        """File (``path`` or ``$LMCACHE_CONFIG_FILE``, if any), then the environment."""
        file_path = path if path is not None else os.environ.get(CONFIG_FILE_ENV) or None
        config = cls.from_file(file_path, strict=strict) if file_path else cls()
        config.update_from_env(strict=strict)
        return config

    def apply(
        self, values: Mapping[str, Any], source: str = "", strict: bool | None = None
    ) -> None:
        """Validate and set ``values``; a key without effect here warns (strict: fails)."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"configuration{describe_source(source)} must be a mapping")
        strict = strict_mode(strict)
        for key, raw in values.items():
            if key in KEYS:
                value = convert_value(key, raw, source, from_env=False)
                self._note_no_effect(key, value, source, strict)
                setattr(self, key, value)
            elif key in UPSTREAM_UNUSED_KEYS:
                self._note_no_effect(key, raw, source, strict)
                self.unused_upstream_keys[key] = raw
            else:
                raise ConfigError(unknown_key_message(key, source))

    def update_from_env(
        self, environ: Mapping[str, str] | None = None, strict: bool | None = None
    ) -> None:
        """Override keys from ``LMCACHE_<KEY_UPPER>``; other LMCACHE_* variables are ignored."""
        env = os.environ if environ is None else environ
        strict = strict_mode(strict, env)
        for key in KEYS:
            var = ENV_PREFIX + key.upper()
            if var in env:
                value = convert_value(key, env[var], var, from_env=True)
                self._note_no_effect(key, value, var, strict)
                setattr(self, key, value)

    def _note_no_effect(self, key: str, value: Any, source: str, strict: bool) -> None:
        """One warning per key (an error in strict mode) for a key nothing here reads."""
        if key in IMPLEMENTED_KEYS:
            return
        message = no_effect_message(key, source)
        if strict:
            raise ConfigError(f"{message} (strict mode: {STRICT_ENV} / strict=True)")
        if key not in self.ignored_keys:
            logger.warning("%s", message)
        self.ignored_keys[key] = value

    # -- views --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in KEYS}

    def validate(self) -> LMCacheEngineConfig:
        """Re-check every key (after attributes were set by hand)."""
        for key in KEYS:
            setattr(self, key, convert_value(key, getattr(self, key), "", from_env=False))
        return self

    @property
    def local_cpu_size_bytes(self) -> int:
        return int(self.max_local_cpu_size * 1024**3)

    @property
    def local_disk_size_bytes(self) -> int:
        return int(self.max_local_disk_size * 1024**3)

    def local_disk_paths(self) -> list[str]:
        """``local_disk`` split on commas, ``file://`` prefixes removed."""
        if not self.local_disk:
            return []
        paths = []
        for item in self.local_disk.split(","):
            item = item.strip()
            if item.startswith("file://"):
                item = item[len("file://") :]
            if item:
                paths.append(item)
        return paths

    def get_extra_config_value(self, key: str, default: Any = None) -> Any:
        return (self.extra_config or {}).get(key, default)
