"""TierSettings: one settings object from either config, and one builder for the tiers."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import make_config

from lmcache.v1.storage_backend import storage_manager
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
from lmcache.v1.storage_backend.redis.connection import RedisUnavailableError
from lmcache.v1.storage_backend.storage_manager import L1_NAME, L2_NAME, create_storage_backends
from lmcache.v1.storage_backend.tier_settings import REMOTE_NAME, TierSettings

UNREACHABLE = "redis://127.0.0.1:1"  # nothing listens on port 1


def _server_tiers(tmp_path: Path, **flags: object) -> TierSettings:
    values: dict[str, object] = {
        "chunk_size": 256,
        "l1_size_gb": 0.01,
        "eviction_policy": "LRU",
        "blocking_timeout_secs": 2,
    }
    values.update(flags)
    return TierSettings.from_server_flags(**values)  # type: ignore[arg-type]


def test_engine_config_remote_url_is_the_remote_backend() -> None:
    tiers = TierSettings.from_engine_config(make_config(remote_url="redis://10.0.0.1:7000/2"))
    assert [t.name for t in tiers.remote] == [REMOTE_NAME]
    assert tiers.remote[0].settings.url == "redis://10.0.0.1:7000/2"
    assert not tiers.disk_enabled


def test_engine_config_non_redis_url_warns_and_adds_no_tier(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="lmcache"):
        tiers = TierSettings.from_engine_config(make_config(remote_url="lm://host:1"))
    assert tiers.remote == ()
    assert "no remote backend" in caplog.text


def test_server_flags_and_engine_config_describe_the_same_tiers(tmp_path: Path) -> None:
    disk = str(tmp_path / "disk")
    server = _server_tiers(
        tmp_path,
        l1_size_gb=0.0625,  # whole bytes: the engine config stores sizes it parsed to bytes
        l2_adapters=[
            f'{{"type": "disk", "path": "{disk}", "size_gb": 2, "adopt": true}}',
            '{"type": "valkey", "host": "h", "port": 7, "namespace": "n"}',
        ],
    )
    engine = TierSettings.from_engine_config(
        make_config(
            max_local_cpu_size=0.0625,
            cache_policy="LRU",
            local_disk=disk,
            max_local_disk_size=2,
            blocking_timeout_secs=2,
            extra_config={"local_disk.adopt": True},
        )
    )
    for tiers in (server, engine):
        assert tiers.disk_enabled and tiers.disk_adopt
        assert tiers.config.local_disk == disk and tiers.config.max_local_disk_size == 2.0
        assert tiers.config.max_local_cpu_size == 0.0625
    assert [(t.name, t.settings.url, t.settings.namespace) for t in server.remote] == [
        ("L2Adapter0:valkey", "redis://h:7", "n")
    ]


def test_bad_redis_adapter_option_is_refused_when_the_settings_are_built(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown option"):
        _server_tiers(tmp_path, l2_adapters=['{"type": "resp", "colour": "red"}'])


def test_builder_makes_every_tier_of_the_settings(tmp_path: Path) -> None:
    tiers = _server_tiers(tmp_path, l2_disk_path=str(tmp_path), l2_disk_size_gb=0.01)
    backends = create_storage_backends(tiers)
    try:
        assert list(backends) == [L1_NAME, L2_NAME]
        assert isinstance(backends[L1_NAME], LocalCPUBackend)
        assert isinstance(backends[L2_NAME], LocalDiskBackend)
        assert backends[L2_NAME].path == str(tmp_path)  # type: ignore[attr-defined]
    finally:
        for backend in reversed(backends.values()):
            backend.close()


def test_a_tier_that_cannot_start_closes_the_ones_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("redis")
    closed: list[str] = []
    for cls in (LocalCPUBackend, LocalDiskBackend):
        real_close = cls.close

        def close(self: object, real_close: object = real_close, name: str = cls.__name__) -> None:
            closed.append(name)
            real_close(self)  # type: ignore[operator]

        monkeypatch.setattr(cls, "close", close)
    tiers = _server_tiers(
        tmp_path,
        l2_disk_path=str(tmp_path),
        l2_disk_size_gb=0.01,
        l2_adapters=[f'{{"type": "resp", "url": "{UNREACHABLE}", "connect_timeout_s": 0.2}}'],
    )
    with pytest.raises(RedisUnavailableError):
        storage_manager.create_storage_backends(tiers)
    assert closed == ["LocalDiskBackend", "LocalCPUBackend"]
