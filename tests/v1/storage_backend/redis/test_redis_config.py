"""Settings from extra_config / remote_url / --l2-adapter JSON, plugin loading, TTL, ACL."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import expected_tensor, fill_obj, make_config, make_key
from redis_servers import RedisServer, make_redis_backend

from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.redis_backend import (
    RedisBackend,
    RedisSettings,
    RedisUnavailableError,
    create_from_l2_adapter,
)
from lmcache.v1.storage_backend.storage_manager import StorageManager, create_storage_backends

pytestmark = pytest.mark.redis


def test_l2_adapter_json_forms() -> None:
    s = RedisSettings.from_l2_adapter('{"type": "resp", "url": "redis://10.0.0.1:7000/2"}')
    assert s.url == "redis://10.0.0.1:7000/2" and not s.cluster
    s = RedisSettings.from_l2_adapter({"type": "valkey", "host": "h", "port": 1, "tls": True})
    assert s.url == "rediss://h:1"
    s = RedisSettings.from_l2_adapter(
        {
            "type": "resp",
            "url": "redis://u:pw@h:1",
            "cluster": "true",
            "ttl_s": "60",
            "namespace": "prod-llama",
            "optional": True,
            "timeout_s": 0.5,
        }
    )
    assert s.cluster and s.ttl_s == 60.0 and s.optional and s.timeout_s == 0.5
    assert "pw" not in str(s.redacted())
    with pytest.raises(ValueError, match="unknown option"):
        RedisSettings.from_l2_adapter({"type": "resp", "urll": "redis://h"})
    with pytest.raises(ValueError, match="not one of"):
        RedisSettings.from_l2_adapter({"type": "disk", "path": "/x"})
    with pytest.raises(ValueError, match="scheme"):
        RedisSettings.from_l2_adapter({"type": "resp", "url": "http://h"})
    with pytest.raises(ValueError, match="braces"):
        RedisSettings(namespace="a{b}")


def test_settings_from_config() -> None:
    config = make_config(
        remote_url="rediss://h:6380",
        extra_config={"storage_plugin.redis.ttl_s": 5, "storage_plugin.redis.cluster": "yes"},
    )
    s = RedisSettings.from_config(config)
    assert s.url == "rediss://h:6380" and s.ttl_s == 5.0 and s.cluster


def test_adapter_factory_and_remote_url_and_plugin(redis_server: RedisServer) -> None:
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    tier = create_from_l2_adapter({"type": "resp", "url": redis_server.url}, cpu)
    assert isinstance(tier, RedisBackend) and tier.available
    tier.close()
    cpu.close()
    backends = create_storage_backends(make_config(remote_url=redis_server.url))
    assert isinstance(backends["RemoteBackend"], RedisBackend)
    for backend in reversed(backends.values()):
        backend.close()
    # By name through the entry point group lmcache.storage_plugins.
    manager = StorageManager(
        make_config(
            storage_plugins=["redis"],
            extra_config={
                "storage_plugin.redis.url": redis_server.url,
                "storage_plugin.redis.namespace": "plugin-test",
            },
        )
    )
    assert isinstance(manager.storage_backends["redis"], RedisBackend)
    manager.close()


def test_ttl_expires_entries(redis_server: RedisServer) -> None:
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    tier = make_redis_backend(redis_server.url, cpu, ttl_s=0.3)
    obj = fill_obj(cpu, 1)
    for future in tier.batched_submit_put_task([make_key(1)], [obj]) or []:
        future.result()
    obj.ref_count_down()
    assert tier.contains(make_key(1))
    time.sleep(0.5)
    assert not tier.contains(make_key(1))
    tier.close()
    cpu.close()


def test_acl_user_and_password(tmp_path: Path) -> None:
    server = RedisServer(tmp_path).start()
    try:
        server.cli("ACL", "SETUSER", "lmc", "on", ">s3cret", "~*", "+@all")
        server.cli("CONFIG", "SET", "requirepass", "adminpw")
        cpu = LocalCPUBackend(make_config(local_cpu=False))
        url = f"redis://lmc:s3cret@127.0.0.1:{server.port}"
        tier = make_redis_backend(url, cpu)
        assert tier.batched_contains([make_key(1)]) == 0
        tier.close()
        with pytest.raises(RedisUnavailableError):
            make_redis_backend(f"redis://lmc:wrong@127.0.0.1:{server.port}", cpu)
        with pytest.raises(RedisUnavailableError):
            make_redis_backend(server.url, cpu)  # no credentials
        tier = make_redis_backend(server.url, cpu, password="adminpw")
        assert tier.available
        tier.close()
        cpu.close()
    finally:
        server.stop()


def test_async_path_on_the_servers_loop(redis_server: RedisServer) -> None:
    """With ``loop=`` the async client is kept and reused on that loop."""
    loop = asyncio.new_event_loop()
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    tier: Any = make_redis_backend(redis_server.url, cpu)
    tier.loop = loop
    try:
        for i in range(3):
            obj = fill_obj(cpu, i)
            for future in tier.batched_submit_put_task([make_key(i)], [obj]) or []:
                future.result()
            obj.ref_count_down()
        keys = [make_key(i) for i in range(5)]
        for _ in range(2):
            assert loop.run_until_complete(tier.batched_async_contains("r", keys)) == 3
        first = tier._aclient
        objs = loop.run_until_complete(tier.batched_get_non_blocking("r", keys))
        assert tier._aclient is first is not None
        assert len(objs) == 3
        for i, obj in enumerate(objs):
            assert torch.equal(obj.tensor, expected_tensor(i))
            obj.ref_count_down()
    finally:
        tier.close()
        loop.close()
        cpu.close()
