"""Upstream 0.5.6's config API (coordinator, P2P, server modules, gRPC/blend flags) here.

Upstream's own tests (tests/v1/multiprocess/test_config.py) cover parsing; these cover
what is ours: the server reports the settings it does not act on instead of dropping them,
``--transport grpc`` is refused, and the new ``--flag/--no-flag`` pair obeys ``--config``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmcache.cli import main as cli_main
from lmcache.cli.commands.server import resolve_config
from lmcache.compat.upstream_056.server_settings.ignored import (
    UpstreamSettings,
    ignored_settings,
)
from lmcache.v1.multiprocess import config as mp_config
from lmcache.v1.multiprocess.config import (
    CoordinatorConfig,
    MPServerConfig,
    P2PConfig,
    add_coordinator_args,
    add_mp_server_args,
    parse_args_to_coordinator_config,
    parse_args_to_mp_server_config,
    parse_args_to_p2p_config,
    parse_server_module_specs,
)
from lmcache.v1.multiprocess.server import run as server_run
from lmcache.v1.multiprocess.server.extensions import check_extension_settings


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No coordinator settings from the environment; the CLI's logger setup is undone."""
    for name in ("LMCACHE_COORDINATOR_URL", "LMCACHE_COORDINATOR_EVENT_REPORTING"):
        monkeypatch.delenv(name, raising=False)
    root = logging.getLogger("lmcache")
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def _server_args(*argv: str) -> argparse.Namespace:
    return cli_main.build_parser().parse_args(["server", *argv])


def test_defaults_ignore_nothing() -> None:
    assert ignored_settings(UpstreamSettings.from_args(_server_args())) == []


def test_each_upstream_only_setting_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    args = _server_args(
        "--engine-type",
        "blend",
        "--null-block-id",
        "-1",
        "--isolated-ipc",
        "--server-module",
        '{"module_path": "pkg.mod"}',
        "--p2p-advertise-url",
        "10.0.0.1:7000",
        "--coordinator-url",
        "http://coord:9300",
        "--coordinator-event-reporting",
    )
    with caplog.at_level(logging.WARNING, logger="lmcache.v1.multiprocess.server.extensions"):
        check_extension_settings(args)
    text = "\n".join(r.getMessage() for r in caplog.records)
    for needle in (
        "--engine-type blend",
        "--null-block-id -1",
        "--isolated-ipc",
        "pkg.mod:build_server_modules",
        "10.0.0.1:7000",
        "http://coord:9300",
        "cache-event reporting",
    ):
        assert needle in text
    assert len(caplog.records) == 7


def test_coordinator_url_from_the_environment_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LMCACHE_COORDINATOR_URL", "http://env-coord:9300")
    ignored = ignored_settings(UpstreamSettings.from_args(_server_args()))
    assert ignored == ["coordinator registration at http://env-coord:9300 (--coordinator-url)"]


def test_grpc_transport_is_refused_before_anything_is_built(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def must_not_run(*_args: Any, **_kwargs: Any) -> int:
        raise AssertionError("the server was started")

    monkeypatch.setattr(server_run, "run_server", must_not_run)
    assert cli_main.main(["server", "--transport", "grpc"]) == 1
    assert "speaks ZMQ only" in capsys.readouterr().err


def test_cli_reports_the_coordinator_settings_and_still_serves(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    seen: dict[str, Any] = {}

    def fake_run_server(config: MPServerConfig, ready: Any = None) -> int:
        seen.update(config=config)
        return 0

    monkeypatch.setattr(server_run, "run_server", fake_run_server)
    argv = ["server", "--coordinator-url", "http://c:9300", "--coordinator-heartbeat-interval"]
    with caplog.at_level(logging.WARNING, logger="lmcache.v1.multiprocess.server.extensions"):
        assert cli_main.main([*argv, "2"]) == 0
    assert "config" in seen
    assert any("http://c:9300" in r.getMessage() for r in caplog.records)


def test_bad_coordinator_setting_is_a_one_line_cli_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main.main(["server", "--coordinator-heartbeat-interval", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("lmcache server: error: coordinator heartbeat interval must be")
    assert err.count("\n") == 1


def test_isolated_ipc_from_a_config_file_and_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("isolated_ipc: true\nengine_type: blend\n")
    args = _server_args("--config", str(config))
    resolve_config(args)  # applies the file to the parsed flags
    from_file = UpstreamSettings.from_args(args)
    assert from_file.isolated_ipc is True and from_file.engine_type == "blend"
    # the command line wins over the file, for the --no- spelling too
    args = _server_args("--config", str(config), "--no-isolated-ipc")
    resolve_config(args)
    assert UpstreamSettings.from_args(args).isolated_ipc is False


def test_config_file_needs_a_boolean_for_isolated_ipc(tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("isolated_ipc: sometimes\n")
    with pytest.raises(ValueError, match=r"^--isolated-ipc \(from .*expected true or false"):
        resolve_config(_server_args("--config", str(config)))


def test_run_script_settings_from_flags_and_a_config_file(tmp_path: Path) -> None:
    default = resolve_config(_server_args())
    assert default.run_script_api_enabled is False and default.script_allowed_imports == []
    flags = resolve_config(
        _server_args("--run-script-api-enabled", "--script-allowed-imports", "math", "json")
    )
    assert flags.run_script_api_enabled is True
    assert flags.script_allowed_imports == ["math", "json"]
    config = tmp_path / "server.yaml"
    config.write_text("run_script_api_enabled: true\nscript_allowed_imports: [math]\n")
    from_file = resolve_config(_server_args("--config", str(config)))
    assert from_file.run_script_api_enabled and from_file.script_allowed_imports == ["math"]
    overridden = resolve_config(
        _server_args("--config", str(config), "--no-run-script-api-enabled")
    )
    assert overridden.run_script_api_enabled is False


def test_p2p_defaults_without_the_p2p_flags() -> None:
    parser = argparse.ArgumentParser()
    add_mp_server_args(parser)  # no add_p2p_args: upstream tolerates the missing flags
    config = parse_args_to_mp_server_config(parser.parse_args([]))
    assert config.p2p_config == P2PConfig()
    assert not config.p2p_config.enabled


def test_p2p_listen_url_defaults_to_the_advertised_one() -> None:
    args = _server_args("--p2p-advertise-url", "h:7000")
    p2p = parse_args_to_p2p_config(args)
    assert p2p.enabled and p2p.effective_listen_url == "h:7000"
    listen = parse_args_to_p2p_config(_server_args("--p2p-listen-url", "0.0.0.0:7000"))
    assert not listen.enabled and listen.effective_listen_url == "0.0.0.0:7000"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[1]", "must be a JSON object"),
        ("{}", "module_path must be a non-empty string"),
        ('{"module_path": "m", "factory_name": ""}', "factory_name must be a non-empty"),
        ('{"module_path": "m", "config": []}', "config must be a JSON object"),
    ],
)
def test_bad_server_module_spec(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_server_module_specs([value])


def test_coordinator_flags_can_join_any_parser() -> None:
    parser = argparse.ArgumentParser()
    add_coordinator_args(parser)
    assert parse_args_to_coordinator_config(parser.parse_args([])) == CoordinatorConfig()


def test_instance_id_given_in_code_is_kept_and_empty_resolves() -> None:
    assert MPServerConfig(instance_id="a").resolved_instance_id() == "a"
    assert len(MPServerConfig(instance_id="").resolved_instance_id()) == 32


def test_validate_checks_the_upstream_fields() -> None:
    with pytest.raises(ValueError, match="--transport"):
        MPServerConfig(transport="http").validate()
    with pytest.raises(ValueError, match="--engine-type"):
        MPServerConfig(engine_type="blend_legacy").validate()
    with pytest.raises(ValueError, match="grpc server workers must be >= 1"):
        MPServerConfig(grpc_server_workers=0).validate()


def test_upstream_names_are_exported() -> None:
    for name in (
        "CoordinatorConfig",
        "HttpCacheEventSinkConfig",
        "KafkaCacheEventSinkConfig",
        "DEFAULT_KAFKA_CACHE_EVENT_TOPIC",
        "DEFAULT_KAFKA_DELIVERY_TIMEOUT",
        "add_coordinator_args",
        "parse_args_to_coordinator_config",
        "parse_args_to_mp_server_config",
        "P2PConfig",
        "add_p2p_args",
    ):
        assert name in mp_config.__all__ and hasattr(mp_config, name)
