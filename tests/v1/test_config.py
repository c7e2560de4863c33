"""LMCacheEngineConfig: defaults, file + environment precedence, validation of every key."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from lmcache.v1.config import (
    ConfigError,
    LMCacheEngineConfig,
    LMCacheMetadata,
    config_keys,
)

UPSTREAM_DEFAULTS = {
    "chunk_size": 256,
    "local_cpu": True,
    "max_local_cpu_size": 5.0,
    "local_cpu_use_hugepages": False,
    "reserve_local_cpu_size": 0.0,
    "local_disk": None,
    "local_disk_path_sharding": "by_gpu",
    "max_local_disk_size": 0.0,
    "remote_url": None,
    "remote_serde": "naive",
    "save_unfull_chunk": False,
    "blocking_timeout_secs": 10,
    "cache_policy": "LRU",
    "storage_plugins": None,
    "remote_storage_plugins": None,
    "extra_config": None,
    "use_layerwise": False,
    "save_decode_cache": False,
    "pre_caching_hash_algorithm": "builtin",
    "gds_path": None,
    "use_gds": True,
    "gds_backend": "cufile",
    "maru_pool_size": 4.0,
    "enable_async_loading": False,
    "enable_lazy_memory_allocator": False,
    "lazy_memory_initial_ratio": 0.2,
    "lazy_memory_expand_trigger_ratio": 0.5,
    "lazy_memory_step_ratio": 0.1,
    "min_retrieve_tokens": 0,
    "lookup_timeout_ms": 3000,
    "pin_timeout_sec": 300,
    "pin_check_interval_sec": 30,
    "mp_host": None,
    "mp_port": 5555,
    "max_hidden_state_cpu_size": 2.0,
}

# One bad value per key, by the kind of the key.
BAD_BY_KIND: dict[str, Any] = {
    "bool": "maybe",
    "int": "twelve",
    "float": "lots",
    "size": "10 parsecs",
    "str": ["not", "a", "string"],
    "list": 42,
    "dict": [1, 2],
}


def _kind(key: str) -> str:
    default = getattr(LMCacheEngineConfig(), key)
    if key in ("extra_config",):
        return "dict"
    if key.endswith(("_plugins", "_locations")):
        return "list"
    if key.startswith("max_") or (
        key.endswith(("_size", "_pool_size")) and key != "gds_buffer_size"
    ):
        return "size"
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int) or key in ("gds_buffer_size", "priority_limit"):
        return "int"
    if isinstance(default, float):
        return "float"
    return "str"


def test_defaults_match_upstream() -> None:
    config = LMCacheEngineConfig()
    for key, value in UPSTREAM_DEFAULTS.items():
        assert getattr(config, key) == value, key


@pytest.mark.parametrize("key", config_keys())
def test_every_key_rejects_a_bad_value_naming_the_key(key: str) -> None:
    bad = BAD_BY_KIND[_kind(key)]
    with pytest.raises(ConfigError) as excinfo:
        LMCacheEngineConfig.from_dict({key: bad})
    assert f"'{key}'" in str(excinfo.value) and repr(bad) in str(excinfo.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("chunk_size", 0),
        ("max_local_cpu_size", -1),
        ("blocking_timeout_secs", -5),
        ("cache_policy", "RANDOM"),
        ("mp_port", 70000),
        ("lazy_memory_step_ratio", 1.5),
        ("remote_serde", "pickle"),
        ("local_disk_path_sharding", "by_moon"),
    ],
)
def test_range_and_choice_checks(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=key):
        LMCacheEngineConfig.from_dict({key: value})


def test_sizes_accept_units() -> None:
    config = LMCacheEngineConfig.from_dict(
        {"max_local_cpu_size": "512MiB", "max_local_disk_size": "10GB"}
    )
    assert config.local_cpu_size_bytes == 512 * 1024**2
    assert config.local_disk_size_bytes == 10 * 1024**3
    assert LMCacheEngineConfig.from_dict({"max_local_cpu_size": 2}).local_cpu_size_bytes == 2 << 30


def test_file_then_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "lmcache.yaml"
    path.write_text(
        "chunk_size: 128\nlocal_disk: 'file:///a,/b'\nmax_local_disk_size: 1.5\n"
        "cache_policy: fifo\nextra_config: {x: 1}\n"
    )
    monkeypatch.setenv("LMCACHE_CONFIG_FILE", str(path))
    monkeypatch.setenv("LMCACHE_CHUNK_SIZE", "64")
    monkeypatch.setenv("LMCACHE_LOCAL_CPU", "false")
    monkeypatch.setenv("LMCACHE_STORAGE_PLUGINS", "a, b")
    monkeypatch.setenv("LMCACHE_REMOTE_URL", "None")
    monkeypatch.setenv("LMCACHE_LOG_LEVEL", "DEBUG")  # not a config key: ignored
    config = LMCacheEngineConfig.load()
    assert config.chunk_size == 64 and config.local_cpu is False
    assert config.cache_policy == "FIFO" and config.max_local_disk_size == 1.5
    assert config.local_disk_paths() == ["/a", "/b"]
    assert config.storage_plugins == ["a", "b"] and config.remote_url is None
    assert config.get_extra_config_value("x") == 1
    monkeypatch.setenv("LMCACHE_EXTRA_CONFIG", '{"y": 2}')
    assert LMCacheEngineConfig.load(path).extra_config == {"y": 2}
    monkeypatch.setenv("LMCACHE_CHUNK_SIZE", "abc")
    with pytest.raises(ConfigError, match="'chunk_size' \\(from LMCACHE_CHUNK_SIZE\\)"):
        LMCacheEngineConfig.load(path)


def test_unknown_and_upstream_only_keys(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("max_local_cpu_sise: 3\n")
    with pytest.raises(
        ConfigError, match=r"unknown config key 'max_local_cpu_sise'.*max_local_cpu_size"
    ):
        LMCacheEngineConfig.from_file(path)
    path.write_text("enable_blending: true\n")
    with caplog.at_level(logging.WARNING, logger="lmcache"):
        config = LMCacheEngineConfig.from_file(path)
    assert config.unused_upstream_keys == {"enable_blending": True}
    assert "enable_blending" in caplog.text
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        LMCacheEngineConfig.from_file(path)


def test_validate_after_manual_edit() -> None:
    config = LMCacheEngineConfig()
    config.chunk_size = -3
    with pytest.raises(ConfigError, match="chunk_size"):
        config.validate()


def test_metadata_chunk_shape() -> None:
    meta = LMCacheMetadata("m", kv_shape=(4, 2, 256, 8, 128), kv_dtype=torch.half)
    assert meta.chunk_shape() == torch.Size([2, 4, 256, 1024])
    assert meta.chunk_bytes() == 2 * 4 * 256 * 1024 * 2
    mla = meta.replace(use_mla=True, kv_shape=(4, 1, 256, 1, 576))
    assert mla.chunk_shape(16) == torch.Size([1, 4, 16, 576])


# -- config that never lies -----------------------------------------------------------------

import re  # noqa: E402

from lmcache.v1 import config as config_module  # noqa: E402

# Accessors of LMCacheEngineConfig and the key each one reads.
_ACCESSORS = {
    "local_disk_paths": "local_disk",
    "local_disk_size_bytes": "max_local_disk_size",
    "local_cpu_size_bytes": "max_local_cpu_size",
    "get_extra_config_value": "extra_config",
}


def _source_reads() -> dict[str, int]:
    """How often each typed key is read as ``config.<key>`` (or through an accessor, or
    ``getattr(config, "<key>")``) outside the lmcache/v1/config package."""
    own = Path(config_module.__file__).resolve().parent
    root = own.parents[1]
    text = "\n".join(p.read_text() for p in root.rglob("*.py") if own not in p.resolve().parents)
    reads = {}
    for key in config_module.config_keys():
        names = [key, *(a for a, k in _ACCESSORS.items() if k == key)]
        pattern = "|".join(rf"config\.{n}\b|getattr\(config, \"{n}\"" for n in names)
        reads[key] = len(re.findall(pattern, text))
    return reads


def test_implemented_table_matches_what_the_source_reads() -> None:
    reads = _source_reads()
    unread_but_claimed = [k for k in config_module.IMPLEMENTED_KEYS if reads[k] == 0]
    assert unread_but_claimed == []
    assert set(config_module.IMPLEMENTED_KEYS) <= set(config_module.config_keys())


def test_keys_marked_without_effect_are_not_read() -> None:
    """Keys with a hint share their name with another component's setting; the rest must
    really be unread, or the table (and the warning) would lie the other way."""
    reads = _source_reads()
    unmarked = [
        k
        for k in config_module.config_keys()
        if not config_module.is_implemented(k) and k not in config_module.NO_EFFECT_HINTS
    ]
    assert {"use_layerwise", "lookup_timeout_ms", "local_cpu_use_hugepages"} <= set(unmarked)
    assert [k for k in unmarked if reads[k]] == []


def test_key_without_effect_warns_once_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lmcache"):
        config = LMCacheEngineConfig.from_dict(
            {"use_layerwise": True, "cache_policy": "fifo"}, source="t.yaml", strict=False
        )
        config.apply({"use_layerwise": False}, source="again", strict=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["config key 'use_layerwise' (from t.yaml) has no effect in lmcache-core"]
    assert config.ignored_keys == {"use_layerwise": False}
    assert config.cache_policy == "FIFO"  # implemented: set, no warning


def test_env_key_without_effect_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(config_module.STRICT_ENV, raising=False)
    monkeypatch.setenv("LMCACHE_LOOKUP_TIMEOUT_MS", "50")
    with caplog.at_level(logging.WARNING, logger="lmcache"):
        config = LMCacheEngineConfig.from_env()
    assert "'lookup_timeout_ms' (from LMCACHE_LOOKUP_TIMEOUT_MS) has no effect" in caplog.text
    assert config.ignored_keys == {"lookup_timeout_ms": 50}


def test_hint_names_where_to_set_it_instead(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lmcache"):
        LMCacheEngineConfig.from_dict({"chunk_size": 512}, strict=False)
    assert "lmcache server --chunk-size" in caplog.text


@pytest.mark.parametrize("values", [{"use_gds": False}, {"enable_blending": True}])
def test_strict_mode_makes_it_an_error(values: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=f"{next(iter(values))}.*has no effect.*strict"):
        LMCacheEngineConfig.from_dict(values, strict=True)


def test_strict_mode_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("max_local_cpu_size: 1\nenable_lazy_memory_allocator: true\n")
    monkeypatch.setenv(config_module.STRICT_ENV, "1")
    with pytest.raises(ConfigError, match="enable_lazy_memory_allocator"):
        LMCacheEngineConfig.load(path)
    monkeypatch.setenv(config_module.STRICT_ENV, "0")
    assert LMCacheEngineConfig.load(path).max_local_cpu_size == 1.0


def test_strict_mode_accepts_implemented_keys() -> None:
    config = LMCacheEngineConfig.from_dict(
        {k: getattr(LMCacheEngineConfig(), k) for k in config_module.IMPLEMENTED_KEYS},
        strict=True,
    )
    assert config.ignored_keys == {}
