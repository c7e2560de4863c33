"""The ``"serde"`` object of an ``--l2-adapter``: upstream's names and fields accepted, and
every mistake (unknown type or field, bad value, missing or short key) refused at
start-up with a message naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prerequisites import require_module

from lmcache.v1.storage_backend.serde import (
    SerdeConfig,
    build_chunk_serde,
    get_registered_serde_types,
    parse_serde_config,
)
from lmcache.v1.storage_backend.tier_settings import TierSettings

require_module(
    "cryptography", "the aesgcm serde needs cryptography (pip install 'lmcache-core[encryption]')"
)


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    path = tmp_path / "master.key"
    path.write_bytes(b"k" * 32)
    return str(path)


def settings(*adapters: dict[str, Any]) -> TierSettings:
    return TierSettings.from_server_flags(
        chunk_size=16,
        l1_size_gb=0.01,
        eviction_policy="LRU",
        blocking_timeout_secs=1,
        l2_adapters=[json.dumps(a) for a in adapters],
    )


def build(spec: dict[str, Any]) -> str:
    return build_chunk_serde(parse_serde_config(spec)).spec


def test_registered_types() -> None:
    assert get_registered_serde_types() == ["fp8", "asym_k16_v8", "aesgcm", "multi"]


def test_upstream_fields(key_file: str) -> None:
    assert build({"type": "fp8", "fp8_dtype": "float8_e5m2", "max_workers": 2.0}) == (
        "fp8:float8_e5m2"
    )
    assert build({"type": "asym_k16_v8"}) == "asym_k16_v8:float8_e4m3fn"
    aes = {"type": "aesgcm", "key_provider": "hkdf", "master_key_path": key_file}
    assert build({**aes, "aes_bits": 128}) == "aesgcm:128"
    assert build({"type": "multi", "serdes": [{"type": "fp8"}, aes]}) == (
        "fp8:float8_e4m3fn+aesgcm:256"
    )


def test_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMC_KEY", "x" * 40)
    assert build({"type": "aesgcm", "master_key_env": "LMC_KEY"}) == "aesgcm:256"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fp8", "'serde' must be a dict"),
        ({"fp8_dtype": "float8_e4m3fn"}, "must include a 'type' field"),
        ({"type": "zstd"}, "Unknown serde type 'zstd'. Registered: aesgcm, asym_k16_v8"),
        ({"type": "fp8", "fp8_dtpye": "x"}, "unknown field\\(s\\) fp8_dtpye"),
        ({"type": "fp8", "fp8_dtype": "float16"}, "fp8_dtype 'float16' is not one of"),
        ({"type": "fp8", "max_workers": 0}, "max_workers must be >= 1"),
        ({"type": "fp8", "max_workers": "two"}, "must be an integer"),
        ({"type": "aesgcm"}, "exactly one of 'master_key_path' or 'master_key_env'"),
        ({"type": "aesgcm", "master_key_path": "/nonexistent/k"}, "cannot read master_key_path"),
        ({"type": "aesgcm", "master_key_env": "LMC_UNSET_KEY_VAR"}, "'LMC_UNSET_KEY_VAR'.*unset"),
        ({"type": "aesgcm", "key_provider": "keyring"}, "unsupported key_provider 'keyring'"),
        ({"type": "multi"}, "needs 'serdes'"),
        ({"type": "multi", "serdes": [{"type": "multi", "serdes": []}]}, "another 'multi'"),
        ({"type": "multi", "serdes": [{"type": "fp8"}, {"type": "asym_k16_v8"}]}, "at most one"),
    ],
)
def test_bad_serde_objects(spec: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_chunk_serde(parse_serde_config(spec))


def test_aes_bits_and_short_key(key_file: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="aes_bits must be 128 or 256"):
        build({"type": "aesgcm", "master_key_path": key_file, "aes_bits": 192})
    short = tmp_path / "short.key"
    short.write_bytes(b"abc")
    with pytest.raises(ValueError, match="has 3 bytes; at least 16"):
        build({"type": "aesgcm", "master_key_path": str(short)})


def test_quantizer_after_encryption_is_refused(key_file: str) -> None:
    aes = {"type": "aesgcm", "master_key_path": key_file}
    with pytest.raises(ValueError, match="quantizer must come first"):
        build({"type": "multi", "serdes": [aes, {"type": "fp8"}]})


def test_adapter_json_carries_serde_per_tier(tmp_path: Path) -> None:
    s = settings(
        {"type": "disk", "path": str(tmp_path), "serde": {"type": "fp8"}},
        {"type": "resp", "url": "redis://127.0.0.1:1", "serde": {"type": "asym_k16_v8"}},
        {"type": "valkey", "url": "redis://127.0.0.1:2"},
    )
    assert s.disk_serde == SerdeConfig("fp8", {})
    assert [t.serde for t in s.remote] == [SerdeConfig("asym_k16_v8", {}), None]
    assert s.remote[0].settings.url == "redis://127.0.0.1:1"  # the tier's own options stay


def test_adapter_without_serde(tmp_path: Path) -> None:
    s = settings({"type": "disk", "path": str(tmp_path)})
    assert s.disk_serde is None


def test_bad_serde_names_the_adapter(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--l2-adapter type 'disk': serde 'fp8': unknown field"):
        settings({"type": "disk", "path": str(tmp_path), "serde": {"type": "fp8", "bits": 8}})
    with pytest.raises(ValueError, match=r"'serde' must be a dict.*--l2-adapter type 'resp'"):
        settings({"type": "resp", "url": "redis://127.0.0.1:1", "serde": "fp8"})
