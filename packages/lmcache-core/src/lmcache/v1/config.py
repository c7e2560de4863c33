"""Typed engine configuration: YAML file + ``LMCACHE_<KEY>`` environment variables.

Precedence, lowest first: built-in defaults, the YAML file (an explicit path, else
``LMCACHE_CONFIG_FILE``), then ``LMCACHE_<KEY_UPPER>`` environment variables — the
environment wins.  Sizes are in GB (1024**3 bytes) as upstream, and also accept units
("10GB", "512MiB"); they are stored as GB floats.

Unknown keys are an error that names the key (with a close match when there is one),
because a misspelt ``max_local_cpu_sise`` silently falling back to a default is worse than
failing at start-up.

The config never lies about what it does: :data:`IMPLEMENTED_KEYS` is the declarative table
of the keys something in this core reads (and what reads them).  Every other accepted key
(typed upstream keys such as ``use_layerwise`` or the GDS/hugepage/lazy-allocator keys, and
the upstream-only keys for blending, P2P, PD, controller ...) loads so upstream config
files still work, but setting it logs one WARNING naming the key and saying it has no
effect here; with strict mode (``strict=True`` or ``LMCACHE_STRICT_CONFIG=1``) it is a
:class:`ConfigError` instead.  Such keys are kept in :attr:`LMCacheEngineConfig.
ignored_keys` (upstream-only ones also in ``unused_upstream_keys``).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import yaml

from lmcache.utils import parse_size

logger = logging.getLogger(__name__)

ENV_PREFIX = "LMCACHE_"
CONFIG_FILE_ENV = "LMCACHE_CONFIG_FILE"
STRICT_ENV = "LMCACHE_STRICT_CONFIG"
CACHE_POLICIES = ("LRU", "FIFO", "LFU", "MRU")
REMOTE_SERDES = ("naive", "cachegen", "kivi")


class ConfigError(ValueError):
    """A configuration key has a bad value, or is unknown."""


def _describe(source: str) -> str:
    return f" (from {source})" if source else ""


# ---------------------------------------------------------------------------------------
# Value parsers: (raw value, from_env) -> typed value, raising ValueError with the reason
# ---------------------------------------------------------------------------------------


def _parse_bool(value: Any, from_env: bool) -> bool:
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


def _parse_int(value: Any, from_env: bool) -> int:
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


def _parse_float(value: Any, from_env: bool) -> float:
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


def _parse_size_gb(value: Any, from_env: bool) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a size (GB number or e.g. '10GB', '512MiB')")
    try:
        return parse_size(value, default_unit="GB") / 1024**3
    except ValueError as exc:
        raise ValueError(f"expected a size (GB number or e.g. '10GB', '512MiB'): {exc}") from None


def _parse_str(value: Any, from_env: bool) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ValueError("expected a string")


def _optional(parser: Callable[[Any, bool], Any]) -> Callable[[Any, bool], Any]:
    def parse(value: Any, from_env: bool) -> Any:
        if value is None:
            return None
        if from_env and isinstance(value, str) and value.strip().lower() in ("", "none", "null"):
            return None
        return parser(value, from_env)

    return parse


def _parse_str_list(value: Any, from_env: bool) -> list[str]:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            value = yaml.safe_load(text)
        else:
            return [item.strip() for item in text.split(",") if item.strip()]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError("expected a list of strings (or a comma-separated string)")


def _parse_int_list(value: Any, from_env: bool) -> list[int]:
    items = _parse_str_list(value, from_env) if isinstance(value, str) else value
    if isinstance(items, list | tuple):
        return [_parse_int(v, from_env) for v in items]
    raise ValueError("expected a list of integers")


def _parse_dict(value: Any, from_env: bool) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ValueError("expected a mapping (JSON/YAML object)") from None
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return dict(value)
    raise ValueError("expected a mapping with string keys")


def _parse_any(value: Any, from_env: bool) -> Any:
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


def _positive(v: Any) -> str | None:
    return None if v is None or v > 0 else "must be > 0"


def _non_negative(v: Any) -> str | None:
    return None if v is None or v >= 0 else "must be >= 0"


def _ratio(v: Any) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be between 0 and 1"


def _port(v: Any) -> str | None:
    return None if v is None or 0 < v < 65536 else "must be a TCP port (1-65535)"


def _one_of(choices: tuple[str, ...], case_insensitive: bool = False) -> Check:
    def check(v: Any) -> str | None:
        if v is None:
            return None
        probe = v.upper() if case_insensitive else v
        return None if probe in choices else f"must be one of {', '.join(choices)}"

    return check


@dataclass(frozen=True)
class _Key:
    parse: Callable[[Any, bool], Any]
    check: Check | None = None


_KEYS: dict[str, _Key] = {
    "chunk_size": _Key(_parse_int, _positive),
    "local_cpu": _Key(_parse_bool),
    "max_local_cpu_size": _Key(_parse_size_gb, _non_negative),
    "local_cpu_use_hugepages": _Key(_parse_bool),
    "reserve_local_cpu_size": _Key(_parse_size_gb, _non_negative),
    "local_disk": _Key(_optional(_parse_str)),
    "local_disk_path_sharding": _Key(_parse_str, _one_of(("by_gpu", "none"))),
    "max_local_disk_size": _Key(_parse_size_gb, _non_negative),
    "remote_url": _Key(_optional(_parse_str)),
    "remote_serde": _Key(_parse_str, _one_of(REMOTE_SERDES)),
    "save_unfull_chunk": _Key(_parse_bool),
    "blocking_timeout_secs": _Key(_parse_int, _positive),
    "cache_policy": _Key(_parse_str, _one_of(CACHE_POLICIES, case_insensitive=True)),
    "storage_plugins": _Key(_optional(_parse_str_list)),
    "remote_storage_plugins": _Key(_optional(_parse_str_list)),
    "extra_config": _Key(_optional(_parse_dict)),
    "use_layerwise": _Key(_parse_bool),
    "save_decode_cache": _Key(_parse_bool),
    "pre_caching_hash_algorithm": _Key(_parse_str),
    "retrieve_locations": _Key(_optional(_parse_str_list)),
    "store_location": _Key(_optional(_parse_str)),
    "gds_path": _Key(_optional(_parse_str)),
    "gds_path_sharding": _Key(_parse_str, _one_of(("by_gpu", "none"))),
    "gds_buffer_size": _Key(_optional(_parse_int), _positive),
    "use_gds": _Key(_parse_bool),
    "gds_backend": _Key(_parse_str),
    "maru_path": _Key(_optional(_parse_str)),
    "maru_pool_size": _Key(_parse_size_gb, _non_negative),
    "numa_mode": _Key(_optional(_parse_str)),
    "enable_async_loading": _Key(_parse_bool),
    "enable_lazy_memory_allocator": _Key(_parse_bool),
    "lazy_memory_initial_ratio": _Key(_parse_float, _ratio),
    "lazy_memory_expand_trigger_ratio": _Key(_parse_float, _ratio),
    "lazy_memory_step_ratio": _Key(_parse_float, _ratio),
    "lazy_memory_safe_size": _Key(_parse_size_gb, _non_negative),
    "priority_limit": _Key(_optional(_parse_int), _non_negative),
    "min_retrieve_tokens": _Key(_parse_int, _non_negative),
    "lookup_timeout_ms": _Key(_parse_int, _non_negative),
    "pin_timeout_sec": _Key(_parse_int, _positive),
    "pin_check_interval_sec": _Key(_parse_int, _positive),
    "mp_host": _Key(_optional(_parse_str)),
    "mp_port": _Key(_parse_int, _port),
    "enable_hidden_state_cache": _Key(_parse_bool),
    "max_hidden_state_cpu_size": _Key(_parse_size_gb, _non_negative),
}

# The keys something in this core reads, and what reads them.  Every other key of _KEYS is
# accepted (upstream files load) but has no effect here: setting one warns, or fails in
# strict mode.  tests/v1/test_config.py checks each entry is really read.
IMPLEMENTED_KEYS: dict[str, str] = {
    "local_cpu": "L1 keeps stored objects (false: L1 only allocates for the lower tiers)",
    "max_local_cpu_size": "size of the L1 host-memory pool",
    "local_disk": "folder(s) of the disk tier",
    "local_disk_path_sharding": "one sub-folder per worker (by_gpu) or none",
    "max_local_disk_size": "size of the disk tier (0: off)",
    "remote_url": "redis:// or rediss:// URL of the Redis tier",
    "blocking_timeout_secs": "how long an L1 allocation waits for eviction to free space",
    "cache_policy": "L1 eviction policy",
    "storage_plugins": "storage plugin tiers to load",
    "extra_config": "options of tiers and plugins (local_cpu.*, local_disk.*, storage_plugin.*)",
}

# Where a key that has no effect through this config is set instead.
NO_EFFECT_HINTS: dict[str, str] = {
    "chunk_size": "the cache server's chunk size is `lmcache server --chunk-size`",
    "mp_host": "vLLM reads the server address from lmcache.mp.host",
    "mp_port": "vLLM reads the server port from lmcache.mp.port",
    "save_decode_cache": "vLLM reads lmcache.mp.save_decode_cache",
    "save_unfull_chunk": "the cache server always stores a request's last partial chunk",
}

# Upstream 0.5.6 keys outside storage: accepted so upstream files load, never interpreted.
UPSTREAM_UNUSED_KEYS = frozenset(
    [
        "enable_blending",
        "blend_recompute_ratios",
        "blend_thresholds",
        "blend_check_layers",
        "blend_min_tokens",
        "blend_special_str",
        "enable_p2p",
        "p2p_host",
        "p2p_init_ports",
        "p2p_lookup_ports",
        "enable_controller",
        "lmcache_instance_id",
        "controller_pull_url",
        "controller_reply_url",
        "lmcache_worker_ports",
        "lmcache_worker_ids",
        "lmcache_worker_heartbeat_delay_time",
        "lmcache_worker_heartbeat_time",
        "enable_pd",
        "pd_role",
        "pd_buffer_size",
        "pd_buffer_device",
        "pd_peer_host",
        "pd_peer_init_port",
        "pd_peer_alloc_port",
        "pd_peer_query_port",
        "pd_proxy_host",
        "pd_proxy_port",
        "pd_allocation_timeout_sec",
        "pd_shutdown_timeout_sec",
        "pd_condition_poll_interval_sec",
        "pd_max_prefill_len",
        "pd_backend_mode",
        "pd_skip_proxy_notification",
        "pd_bidirectional",
        "transfer_channel",
        "nixl_backends",
        "nixl_buffer_size",
        "nixl_buffer_device",
        "audit_actual_remote_url",
        "internal_api_server_host",
        "internal_api_server_enabled",
        "internal_api_server_port_start",
        "internal_api_server_include_index_list",
        "internal_api_server_socket_path_prefix",
        "external_lookup_client",
        "py_enable_gc",
        "runtime_plugin_locations",
        "hit_miss_ratio",
        "lookup_server_worker_ids",
        "enable_scheduler_bypass_lookup",
        "script_allowed_imports",
        "run_script_api_enabled",
        "enable_chunk_statistics",
        "chunk_statistics_strategy",
        "enable_kv_events",
        "use_gpu_connector_v3",
        "remote_config_url",
        "app_id",
        "hidden_state_layers",
        "hidden_states_retrieve_mode",
    ]
)


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
        config.apply(_read_yaml(path), source=str(path), strict=strict)
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
            raise ConfigError(f"configuration{_describe(source)} must be a mapping")
        strict = strict_mode(strict)
        for key, raw in values.items():
            if key in _KEYS:
                value = _convert(key, raw, source, from_env=False)
                self._note_no_effect(key, value, source, strict)
                setattr(self, key, value)
            elif key in UPSTREAM_UNUSED_KEYS:
                self._note_no_effect(key, raw, source, strict)
                self.unused_upstream_keys[key] = raw
            else:
                raise ConfigError(_unknown_key_message(key, source))

    def update_from_env(
        self, environ: Mapping[str, str] | None = None, strict: bool | None = None
    ) -> None:
        """Override keys from ``LMCACHE_<KEY_UPPER>``; other LMCACHE_* variables are ignored."""
        env = os.environ if environ is None else environ
        strict = strict_mode(strict, env)
        for key in _KEYS:
            var = ENV_PREFIX + key.upper()
            if var in env:
                value = _convert(key, env[var], var, from_env=True)
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
        return {key: getattr(self, key) for key in _KEYS}

    def validate(self) -> LMCacheEngineConfig:
        """Re-check every key (after attributes were set by hand)."""
        for key in _KEYS:
            setattr(self, key, _convert(key, getattr(self, key), "", from_env=False))
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


def config_keys() -> list[str]:
    """Every typed key :class:`LMCacheEngineConfig` accepts (implemented or not)."""
    return list(_KEYS)


def is_implemented(key: str) -> bool:
    """Whether something in this core reads ``key`` (see :data:`IMPLEMENTED_KEYS`)."""
    return key in IMPLEMENTED_KEYS


def no_effect_message(key: str, source: str = "") -> str:
    hint = NO_EFFECT_HINTS.get(key)
    return f"config key {key!r}{_describe(source)} has no effect in lmcache-core" + (
        f"; {hint}" if hint else ""
    )


def strict_mode(strict: bool | None, environ: Mapping[str, str] | None = None) -> bool:
    """The explicit argument, else ``LMCACHE_STRICT_CONFIG`` (1/true/yes/on)."""
    if strict is not None:
        return strict
    env = os.environ if environ is None else environ
    raw = env.get(STRICT_ENV, os.environ.get(STRICT_ENV, ""))
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _convert(key: str, raw: Any, source: str, from_env: bool) -> Any:
    spec = _KEYS[key]
    try:
        value = spec.parse(raw, from_env)
        reason = spec.check(value) if spec.check is not None else None
    except (ValueError, TypeError) as exc:
        reason = str(exc)
    if reason is not None:
        raise ConfigError(
            f"invalid value for config key {key!r}{_describe(source)}: {raw!r} ({reason})"
        )
    if key == "cache_policy":
        value = value.upper()
    return value


def _unknown_key_message(key: str, source: str) -> str:
    close = difflib.get_close_matches(str(key), list(_KEYS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown config key {key!r}{_describe(source)}{hint}"


def _read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
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


@dataclass
class LMCacheMetadata:
    """What the storage tiers need to know about the model and this worker.

    ``kv_shape`` is ``(num_layers, 2, chunk_size, num_kv_heads, head_size)`` as upstream;
    for MLA models the second entry is 1.
    """

    model_name: str
    world_size: int = 1
    worker_id: int = 0
    kv_dtype: torch.dtype = torch.bfloat16
    kv_shape: tuple[int, ...] = (1, 2, 256, 1, 128)
    use_mla: bool = False
    chunk_size: int = 256
    fmt: str = "vllm"
    role: str = "worker"
    extra: dict[str, Any] = field(default_factory=dict)

    def chunk_shape(self, num_tokens: int | None = None) -> torch.Size:
        """Shape of one chunk in the layout the tiers store (KV_2LTD or KV_MLA_FMT)."""
        tokens = self.chunk_size if num_tokens is None else num_tokens
        num_layers, _, _, heads, head_size = self.kv_shape
        if self.use_mla:
            return torch.Size([1, num_layers, tokens, head_size])
        return torch.Size([2, num_layers, tokens, heads * head_size])

    def chunk_bytes(self) -> int:
        return self.chunk_shape().numel() * self.kv_dtype.itemsize

    def replace(self, **changes: Any) -> LMCacheMetadata:
        return dataclasses.replace(self, **changes)
