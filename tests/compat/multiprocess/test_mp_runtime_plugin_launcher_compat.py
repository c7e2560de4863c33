"""MP runtime plugins, run for real (upstream 0.5.6's tests mock the process launch)."""

from __future__ import annotations

import enum
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lmcache.v1.multiprocess.runtime_plugins.launcher import RuntimePluginLauncher
from lmcache.v1.multiprocess.runtime_plugins.mp_launcher import MPRuntimePluginLauncher


class _Mode(enum.Enum):
    FAST = "fast"


@dataclass
class _PluginSettings:
    locations: list[str] = field(default_factory=list)
    extra_config: dict[str, object] = field(default_factory=dict)


@dataclass
class _ServerConfig:
    port: int = 5555
    root: Path = Path("/srv/cache")
    mode: _Mode = _Mode.FAST
    tiers: tuple[str, ...] = ("l1", "l2")


@dataclass
class _RawConfig:
    """The config ``RuntimePluginLauncher`` itself reads."""

    runtime_plugin_locations: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return "{}"


def _wait_for(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written within {timeout}s")


def _wait_exited(launcher: RuntimePluginLauncher) -> None:
    for proc in launcher.plugin_processes:
        proc.wait(timeout=20)


def test_plugins_run_with_every_config_in_their_environment(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    # ``server_0_`` would be filtered by role and worker id in non-MP mode; MP has no roles.
    plugin = tmp_path / "server_7_dump.py"
    plugin.write_text(
        f"#!{sys.executable}\n"
        "import json, os\n"
        "keys = ['ROLE', 'CONFIG', 'WORKER_COUNT', 'WORKER_ID']\n"
        "seen = {k: os.environ['LMCACHE_RUNTIME_PLUGIN_' + k] for k in keys}\n"
        "seen['legacy'] = os.environ['LMCACHE_PLUGIN_CONFIG']\n"
        f"open({str(out)!r}, 'w').write(json.dumps(seen) + '\\n')\n"
    )
    launcher = MPRuntimePluginLauncher(
        _PluginSettings(locations=[str(tmp_path)], extra_config={"token": Path("/t")}),
        server=_ServerConfig(),
    )
    try:
        launcher.launch_plugins()
        seen = json.loads(_wait_for(out))
    finally:
        launcher.stop_plugins()
    assert seen["ROLE"] == "" and seen["WORKER_COUNT"] == "1" and seen["WORKER_ID"] == "0"
    config = json.loads(seen["CONFIG"])
    assert config == {
        "server": {"port": 5555, "root": "/srv/cache", "mode": "_Mode.FAST", "tiers": ["l1", "l2"]},
        "runtime_plugin_extra_config": {"token": "/t"},
    }
    assert seen["legacy"] == seen["CONFIG"]


def test_env_shebang_resolves_its_program(tmp_path: Path) -> None:
    # upstream resolved the whole ``/usr/bin/env bash`` string, which never exists, and
    # fell back to the defaults; the named program is tried before them here.
    script = tmp_path / "tool.sh"
    script.write_text("#!/usr/bin/env sh\necho hi\n")
    launcher = RuntimePluginLauncher(_RawConfig(), "WORKER", 1, 0)
    assert Path(launcher._get_interpreter(script)).name == "sh"


def test_a_broken_plugin_does_not_stop_the_others(tmp_path: Path) -> None:
    out = tmp_path / "ok.txt"
    (tmp_path / "a_broken.sh").write_text("#!/nonexistent/interpreter\n")
    (tmp_path / "b_ok.sh").write_text(f"#!/bin/sh\necho ok > {out}\n")
    launcher = MPRuntimePluginLauncher(_PluginSettings(locations=[str(tmp_path)]))
    with pytest.MonkeyPatch.context() as patch:
        # Without bash on PATH the broken one has no interpreter at all.
        patch.setenv("PATH", "/nonexistent")
        launcher.launch_plugins()
    try:
        assert _wait_for(out) == "ok\n"
    finally:
        launcher.stop_plugins()
    assert len(launcher._inner.plugin_processes) == 1


def test_stop_plugins_terminates_a_running_plugin(tmp_path: Path) -> None:
    (tmp_path / "sleeper.py").write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    launcher = RuntimePluginLauncher(_RawConfig([str(tmp_path)]), None, 1, 0)
    launcher.launch_plugins()
    assert len(launcher.plugin_processes) == 1
    launcher.stop_plugins()
    _wait_exited(launcher)
    assert launcher.plugin_processes[0].returncode != 0
    launcher.stop_plugins()  # already exited: nothing to do


def test_configs_must_be_dataclass_instances() -> None:
    with pytest.raises(TypeError, match="Expected a dataclass instance for config 'cls'"):
        MPRuntimePluginLauncher(_PluginSettings(), cls=_ServerConfig)
