"""``kv_connector_extra_config`` parsing (no vLLM needed)."""

from __future__ import annotations

import logging

import pytest

from lmcache.integration.vllm.mp_config import DEFAULTS, parse_extra_config
from lmcache.v1.platform.transfer_mode import MPTransferMode


def test_defaults_match_upstream() -> None:
    cfg = parse_extra_config({}, env={})
    assert cfg.server_urls == ("tcp://localhost:5555",)
    assert cfg.mq_timeout == 300.0 and cfg.heartbeat_interval == 10.0
    assert cfg.nonblocking_lookup_status is True
    assert cfg.mp_transfer_mode == MPTransferMode.AUTO
    assert cfg.save_decode_cache is False and cfg.eager_prefetch is False
    assert DEFAULTS["hash_algorithm"] == "blake3"


def test_seed_config_strings_are_coerced() -> None:
    cfg = parse_extra_config(
        {
            "lmcache.mp.host": "tcp://localhost",
            "lmcache.mp.port": "5555",
            "lmcache.mp.mp_transfer_mode": "engine_driven",
            "lmcache.mp.mq_timeout": "12.5",
            "lmcache.mp.save_decode_cache": "true",
        },
        env={},
    )
    assert cfg.server_urls == ("tcp://localhost:5555",)
    assert cfg.mp_transfer_mode == MPTransferMode.ENGINE_DRIVEN
    assert cfg.mq_timeout == 12.5 and cfg.save_decode_cache is True


def test_host_without_scheme_and_server_urls_win() -> None:
    assert parse_extra_config({"lmcache.mp.host": "127.0.0.1"}, env={}).server_urls == (
        "tcp://127.0.0.1:5555",
    )
    cfg = parse_extra_config(
        {"lmcache.mp.server_urls": "h1:6667, tcp://h2:6667", "lmcache.mp.port": 1}, env={}
    )
    assert cfg.server_urls == ("tcp://h1:6667", "tcp://h2:6667")


def test_transfer_mode_env_and_extra_config_wins() -> None:
    env = {"LMCACHE_MP_TRANSFER_MODE": "lmcache_driven"}
    assert parse_extra_config({}, env=env).mp_transfer_mode == MPTransferMode.LMCACHE_DRIVEN
    cfg = parse_extra_config({"lmcache.mp.mp_transfer_mode": "ENGINE_DRIVEN"}, env=env)
    assert cfg.mp_transfer_mode == MPTransferMode.ENGINE_DRIVEN
    with pytest.raises(ValueError, match="LMCACHE_MP_TRANSFER_MODE"):
        parse_extra_config({}, env={"LMCACHE_MP_TRANSFER_MODE": "warp"})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lmcache.mp.port", "http"),
        ("lmcache.mp.port", 70000),
        ("lmcache.mp.mq_timeout", "-1"),
        ("lmcache.mp.heartbeat_interval", 0),
        ("lmcache.mp.save_decode_cache", "maybe"),
        ("lmcache.mp.mp_transfer_mode", "warp"),
        ("lmcache.mp.server_urls", 5),
        ("lmcache.max_offload_tokens", "lots"),
        ("lmcache.mp.lookup_refresh_interval", "-1"),
        # Non-finite numbers slip past every bound (NaN compares false): refused at parse.
        ("lmcache.mp.lookup_refresh_interval", "nan"),
        ("lmcache.mp.mq_timeout", "inf"),
        ("lmcache.mp.heartbeat_interval", float("nan")),
    ],
)
def test_bad_values_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        parse_extra_config({key: value}, env={})


def test_unknown_keys_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        parse_extra_config({"lmcache.mp.prot": 1, "other.key": 2}, env={})
    assert "lmcache.mp.prot" in caplog.text
    assert "other.key" not in caplog.text


def test_unsupported_features_are_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match=r"lmcache\.mp\.use_vmm_api"):
        parse_extra_config({"lmcache.mp.use_vmm_api": True}, env={})
    parse_extra_config({"lmcache.mp.use_vmm_api": False}, env={})
