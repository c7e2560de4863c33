"""``GET /config`` and ``GET /config/adapters`` (upstream 0.5.6's ``config_api``) over a real
:class:`~lmcache.v1.multiprocess.server.handler.MPCacheServer`, mounted as
:class:`~lmcache.v1.multiprocess.http_api_registry.HTTPAPIRegistry` mounts them: the
document comes from the server's own configuration and tiers, and no secret leaks."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from lmcache.compat.upstream_056.http_api_registry import HTTPAPIRegistry
from lmcache.compat.upstream_056.http_apis.dependencies import build_context
from lmcache.v1.multiprocess.server import MPCacheServer, build_cache_server
from lmcache.v1.multiprocess.server.config_report import (
    REDACTED,
    is_secret_key,
    redact_secrets,
)
from lmcache.v1.multiprocess.server_config import MPServerConfig

ADMIN_TOKEN = "admin-token-do-not-leak-0123456789"
REDIS_PASSWORD = "redis-pw-do-not-leak"
URL_PASSWORD = "url-pw-do-not-leak"
SECRETS = (ADMIN_TOKEN, REDIS_PASSWORD, URL_PASSWORD)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(**overrides: Any) -> MPServerConfig:
    base: dict[str, Any] = {
        "chunk_size": 16,
        "l1_size_gb": 1 / 64,
        "shm_name": "",
        "disable_metrics": True,
        "l2_prefetch_max_in_flight": 0,
    }
    return MPServerConfig(**(base | overrides))


@pytest.fixture
def tiered(tmp_path: Path) -> Iterator[MPCacheServer]:
    """A server with a disk tier and an (unreachable, optional) Redis tier, whose flags
    carry an admin token and two Redis passwords."""
    redis = {
        "type": "resp",
        "url": f"redis://alice:{URL_PASSWORD}@127.0.0.1:{_closed_port()}",
        "optional": True,
        "connect_timeout_s": 0.2,
        "timeout_s": 0.2,
    }
    disk = {"type": "fs", "path": str(tmp_path / "l2"), "size_gb": 0.01}
    engine = build_cache_server(
        _config(
            admin_token=ADMIN_TOKEN,
            enable_admin_ops=True,
            l2_adapters=[json.dumps(disk), json.dumps(redis | {"password": REDIS_PASSWORD})],
        )
    )
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture
def l1_only() -> Iterator[MPCacheServer]:
    engine = build_cache_server(_config())
    try:
        yield engine
    finally:
        engine.close()


def _client(engine: Any = None, configs: Any = None) -> TestClient:
    app = FastAPI()
    HTTPAPIRegistry(app).register_all_apis()
    if engine is not None:
        app.state.engine = engine
    if configs is not None:
        app.state.configs = configs
    return TestClient(app)


def test_routes_are_mounted_and_answer_503_before_the_engine() -> None:
    app = FastAPI()
    HTTPAPIRegistry(app).register_all_apis()
    assert {"/config", "/config/adapters"} <= set(app.openapi()["paths"])
    client = TestClient(app)
    reply = client.get("/config")
    assert reply.status_code == 503 and reply.json() == {"error": "configs not initialized"}
    assert client.get("/config/adapters").status_code == 503


def test_config_reports_the_real_servers_configuration(tiered: MPCacheServer) -> None:
    reply = _client(tiered).get("/config")
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert set(body) == {"mp", "server", "storage_manager"}
    mp = body["mp"]
    assert mp["chunk_size"] == 16 and mp["supported_transfer_mode"] == "auto"
    assert mp["instance_id"] == tiered.settings.instance_id
    # the --l2-adapter values are objects, their credentials redacted
    disk_spec, redis_spec = mp["l2_adapters"]
    assert disk_spec["type"] == "fs"
    assert redis_spec["password"] == REDACTED
    assert redis_spec["url"].startswith(f"redis://alice:{REDACTED}@127.0.0.1:")
    assert body["server"]["chunk_size"] == 16
    assert body["server"]["admin"] == {"wire_enabled": True, "token": REDACTED}
    storage = body["storage_manager"]
    assert storage["l1"]["capacity_bytes"] == tiered.storage.local_cpu_backend.capacity_bytes
    disk, redis = storage["l2_adapter_config"]["adapters"]
    assert (disk["name"], disk["type_name"], disk["kind"]) == ("LocalDiskBackend", "fs", "disk")
    disk_tier: Any = tiered.storage.storage_backends["LocalDiskBackend"]
    assert disk["path"] == disk_tier.path
    assert (redis["type_name"], redis["kind"]) == ("resp", "remote")
    assert redis["options"]["password"] == REDACTED
    assert redis["options"]["url"].startswith(f"redis://alice:{REDACTED}@")


def test_config_never_shows_a_secret(tiered: MPCacheServer) -> None:
    raw = _client(tiered).get("/config").text
    assert "\n" in raw and '  "mp"' in raw  # indented for people
    for secret in SECRETS:
        assert secret not in raw
    # The server still has them: redaction is of the report only.
    assert tiered.settings.admin.token == ADMIN_TOKEN
    assert tiered.server_config is not None and tiered.server_config.admin_token == ADMIN_TOKEN


def test_adapters_list_the_servers_l2_tiers(tiered: MPCacheServer) -> None:
    reply = _client(tiered).get("/config/adapters")
    assert reply.status_code == 200, reply.text
    assert reply.json() == {
        "adapters": [
            {
                "index": 0,
                "type_name": "fs",
                "tier": "l2",
                "primary": True,
                "reconfigurable": False,
                "name": "LocalDiskBackend",
            },
            {
                "index": 1,
                "type_name": "resp",
                "tier": "l2",
                "primary": False,
                "reconfigurable": False,
                "name": "L2Adapter0:resp",
            },
        ]
    }


def test_an_l1_only_server_has_no_adapters(l1_only: MPCacheServer) -> None:
    client = _client(l1_only)
    assert client.get("/config/adapters").json() == {"adapters": []}
    body = client.get("/config").json()
    assert body["storage_manager"]["l2_adapter_config"]["adapters"] == []
    assert body["server"]["admin"]["token"] is None  # no token: nothing to hide
    assert body["mp"]["admin_token"] is None


def test_disk_flag_tier_is_type_disk(tmp_path: Path) -> None:
    engine = build_cache_server(_config(l2_disk_path=str(tmp_path), l2_disk_size_gb=0.01))
    try:
        listing = _client(engine).get("/config/adapters").json()["adapters"]
    finally:
        engine.close()
    assert [(a["type_name"], a["name"]) for a in listing] == [("disk", "LocalDiskBackend")]


def test_a_server_built_without_flags_reports_no_mp_section(l1_only: MPCacheServer) -> None:
    l1_only.server_config = None
    body = _client(l1_only).get("/config").json()
    assert set(body) == {"server", "storage_manager"}


def test_a_set_context_is_used_over_the_engine(l1_only: MPCacheServer) -> None:
    app = FastAPI()
    HTTPAPIRegistry(app).register_all_apis()
    app.state.context = build_context(l1_only)
    assert TestClient(app).get("/config/adapters").json() == {"adapters": []}


@dataclass
class _WithSecrets:
    host: str = "0.0.0.0"
    admin_token: str | None = ADMIN_TOKEN
    admin_token_file: str = "/etc/lmcache/token"
    max_tokens: int = 4096


def test_explicit_configs_win_and_are_redacted(l1_only: MPCacheServer) -> None:
    configs = {
        "mp": _WithSecrets(),
        "extra": {
            "remote_url": f"redis://:{URL_PASSWORD}@cache:6379/0",
            "adapter": json.dumps({"type": "resp", "password": REDIS_PASSWORD}),
            "endpoint": f"https://s3.example/bucket?X-Amz-Credential=abc&api_key={URL_PASSWORD}",
            "nested": [{"secretKey": REDIS_PASSWORD, "use_token": True}],
        },
    }
    reply = _client(l1_only, configs=configs).get("/config")
    body = reply.json()
    assert set(body) == {"mp", "extra"}  # app.state.configs, not the engine's
    assert body["mp"] == {
        "host": "0.0.0.0",
        "admin_token": REDACTED,
        "admin_token_file": "/etc/lmcache/token",
        "max_tokens": 4096,
    }
    extra = body["extra"]
    assert extra["remote_url"] == f"redis://:{REDACTED}@cache:6379/0"
    assert json.loads(extra["adapter"]) == {"type": "resp", "password": REDACTED}
    assert extra["endpoint"] == (
        f"https://s3.example/bucket?X-Amz-Credential={REDACTED}&api_key={REDACTED}"
    )
    assert extra["nested"] == [{"secretKey": REDACTED, "use_token": True}]
    for secret in SECRETS:
        assert secret not in reply.text


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("admin_token", True),
        ("token", True),
        ("password", True),
        ("storage_plugin.redis.password", True),
        ("apiKey", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("access-key-id", True),
        ("private_key", True),
        ("admin_token_file", False),
        ("ssl_keyfile", False),
        ("max_tokens", False),
        ("hit_tokens", False),
        ("keyspace", False),
        ("", False),
    ],
)
def test_secret_key_names(name: str, secret: bool) -> None:
    assert is_secret_key(name) is secret


def test_redaction_leaves_plain_values_alone() -> None:
    plain = {
        "url": "redis://cache:6379",
        "path": "/tmp/x",
        "password": None,
        "n": [1, 2.5, "a@b"],
        "text": "{not json}",
    }
    assert redact_secrets(plain) == plain
    assert redact_secrets({"token": 1234}) == {"token": REDACTED}
    assert redact_secrets("redis://tok3n@host") == f"redis://{REDACTED}@host"
