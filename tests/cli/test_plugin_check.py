"""``lmcache plugin check`` explains every problem of an installed plugin in one line,
and ``lmcache devices`` shows the same diagnoses."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from nocore import write_upstream_metadata

CLI = "import sys\nfrom lmcache.cli.main import main\nsys.exit(main({argv!r}))"


def _cli(run_python: Any, argv: list[str], pythonpath: str, **env: str) -> Any:
    return run_python(CLI.format(argv=argv), {"PYTHONPATH": pythonpath, **env})


@pytest.mark.parametrize(
    ("plugin", "name", "needle"),
    [
        ("importerror", "brokenimport", "import failed: ImportError"),
        ("wrongtype", "wrongtype", "not a factory or instance"),
        ("instance", "instance", "got an instance of"),
        ("raising", "raising", "constructor raised"),
        ("mismatch", "mismatch", "entry-point name must match DeviceSpec.backend_name"),
        ("uppercase", "uppercase", "non-empty lowercase string"),
        ("duplicate", "cpu", "already registered by in-tree"),
    ],
)
def test_each_broken_test_plugin_is_one_problem_line(
    run_python: Any, installed_plugins: Callable[..., str], plugin: str, name: str, needle: str
) -> None:
    proc = _cli(run_python, ["plugin", "check", name], installed_plugins(plugin))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if f"{name}: problem:" in line]
    assert len(lines) == 1 and needle in lines[0], proc.stdout


def test_good_plugin_passes(run_python: Any, installed_plugins: Callable[..., str]) -> None:
    # By name: under nox every broken registry test plugin is installed as well.
    proc = _cli(run_python, ["plugin", "check", "fakegood"], installed_plugins("good"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ok_line = "fakegood = lmcache_tp_good:GoodSpec (lmcache-testplugin-good 0.0.1): ok"
    assert ok_line in proc.stdout
    # Without a name every installed entry point is checked, this one among them.
    everything = _cli(run_python, ["plugin", "check"], installed_plugins("good", "raising"))
    assert ok_line in everything.stdout
    assert "raising: problem: skipped by the registry" in everything.stdout
    assert everything.returncode == 1


def test_priority_tie_names_the_variable(
    run_python: Any, installed_plugins: Callable[..., str]
) -> None:
    path = installed_plugins("twins")
    proc = _cli(run_python, ["plugin", "check", "twina"], path,
                LMCACHE_TEST_PLUGINS_AVAILABLE="1")  # fmt: skip
    assert proc.returncode == 1
    assert "twina: problem: priority 0 ties with available backend(s) twinb" in proc.stdout
    assert "LMCACHE_DEVICE_BACKEND=twina" in proc.stdout
    # Unavailable twins are a warning, not a failure; distinct priorities are fine.
    assert _cli(run_python, ["plugin", "check", "twina"], path).returncode == 0
    assert "ok" in _cli(run_python, ["plugin", "check", "prioa"], path).stdout


def test_unknown_name_is_an_error(run_python: Any, installed_plugins: Callable[..., str]) -> None:
    proc = _cli(run_python, ["plugin", "check", "nosuch"], installed_plugins("good"))
    assert proc.returncode == 1
    assert "no installed lmcache.device_plugins entry point or backend named 'nosuch'" in (
        proc.stderr
    )


BROKEN_SPECS = """
    import os
    from typing import ClassVar
    from lmcache.v1.platform.base.device_ops import DeviceOps
    from lmcache.v1.platform.base.device_spec import DeviceSpec

    if os.environ.get("HEAVY_IMPORT") == "1":
        import sys, types
        sys.modules["vllm"] = types.ModuleType("vllm")

    class OtherOps(DeviceOps):
        device_type: ClassVar[str] = "cuda"

    class Base(DeviceSpec):
        device_type = property(lambda self: "kitdev")
        torch_module_name = property(lambda self: "cpu")

    class Raises(Base):
        backend_name = property(lambda self: "raises")
        def is_available(self):
            raise OSError("driver missing")

    class WrongOps(Base):
        backend_name = property(lambda self: "wrongops")
        priority = property(lambda self: 1)
        ops_cls = property(lambda self: OtherOps)

    class HalfDriven(Base):
        backend_name = property(lambda self: "halfdriven")
        priority = property(lambda self: 2)
        def is_lmcache_driven_available(self):
            return True
"""
BROKEN_EPS = {
    "raises": "kit_broken:Raises",
    "wrongops": "kit_broken:WrongOps",
    "halfdriven": "kit_broken:HalfDriven",
}


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("raises", "is_available() raised OSError: driver missing"),
        ("wrongops", "OtherOps.device_type is 'cuda' but the spec's device_type is 'kitdev'"),
        ("halfdriven", "lacks ipc_wrapper_cls"),
    ],
)
def test_spec_level_problems(
    run_python: Any, installed_module: Callable[..., str], name: str, needle: str
) -> None:
    path = installed_module("kit_broken", BROKEN_SPECS, BROKEN_EPS)
    proc = _cli(run_python, ["plugin", "check", name], path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert needle in proc.stdout
    if name == "halfdriven":
        assert "create_cache_context()" in proc.stdout and "event_ipc_backend" in proc.stdout


def test_heavy_and_slow_imports_are_problems(
    run_python: Any, installed_module: Callable[..., str]
) -> None:
    path = installed_module("kit_broken", BROKEN_SPECS, BROKEN_EPS)
    proc = _cli(run_python, ["plugin", "check", "wrongops"], path, HEAVY_IMPORT="1")
    assert "wrongops: problem: importing kit_broken imports vllm" in proc.stdout
    proc = _cli(run_python, ["plugin", "check", "wrongops", "--max-import-seconds", "0"], path)
    assert "wrongops: problem: importing kit_broken took" in proc.stdout


def test_devices_shows_diagnoses_and_device_type_fallback(
    run_python: Any, installed_module: Callable[..., str]
) -> None:
    path = installed_module("kit_broken", BROKEN_SPECS, BROKEN_EPS)
    proc = _cli(run_python, ["devices", "--json"], path, DEVICE_TYPE="kitdev")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    lines = report["diagnoses"]
    assert any(line.startswith("raises: problem: is_available() raised") for line in lines)
    assert any(line.startswith("wrongops: problem: ops class") for line in lines)
    fallback = report["device_type_fallback"]
    assert "DEVICE_TYPE=kitdev: no backend of that type is usable" in fallback
    assert "raises: is_available() raised OSError" in fallback
    assert report["selected"]["device_type"] == "cpu"
    text = _cli(run_python, ["devices"], path, DEVICE_TYPE="nosuchdev").stdout
    assert "DEVICE_TYPE=nosuchdev: no registered backend has that device_type" in text
    assert "Diagnoses:" in text and "halfdriven: problem:" in text


SEED_STYLE = """
    from lmcache.v1.platform.base.device_spec import DeviceSpec

    class SeedSpec(DeviceSpec):
        device_type = property(lambda self: "seeddev")
        backend_name = property(lambda self: "seedfoo")
        torch_module_name = property(lambda self: "seeddev")
"""
FIX = 'dependencies = ["lmcache-core>=0.1,<0.2"] instead of "lmcache"'


def test_plugin_requiring_upstream_lmcache_is_a_problem_with_the_fix(
    run_python: Any, installed_module: Callable[..., str]
) -> None:
    # The seed guide's pyproject: dependencies = ["lmcache"], installed with --no-deps.
    path = installed_module("seed_style", SEED_STYLE, {"seedfoo": "seed_style:SeedSpec"},
                            requires=["lmcache"])  # fmt: skip
    proc = _cli(run_python, ["plugin", "check", "seedfoo"], path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if "seedfoo: problem:" in line]
    assert "lmcache-inline-seed-style 0.0.1 requires 'lmcache'" in line
    assert "upstream LMCache's distribution, not lmcache-core" in line and FIX in line
    report = json.loads(_cli(run_python, ["devices", "--json"], path).stdout)
    assert any(d.startswith("seedfoo: problem:") and FIX in d for d in report["diagnoses"])


def test_plugin_requiring_lmcache_core_is_fine(
    run_python: Any, installed_module: Callable[..., str]
) -> None:
    path = installed_module("seed_fixed", SEED_STYLE, {"seedfoo": "seed_fixed:SeedSpec"},
                            requires=["lmcache-core>=0.1,<0.2"])  # fmt: skip
    proc = _cli(run_python, ["plugin", "check", "seedfoo"], path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(lmcache-inline-seed-fixed 0.0.1): ok" in proc.stdout


def test_upstream_installed_beside_the_core_is_a_problem(
    run_python: Any, installed_plugins: Callable[..., str], tmp_path: Path
) -> None:
    path = installed_plugins("good")
    write_upstream_metadata(tmp_path / "site")  # the folder installed_plugins put first
    proc = _cli(run_python, ["plugin", "check", "fakegood"], path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("lmcache-core: problem: upstream LMCache's distribution lmcache 0.5.6")
    assert "pip uninstall -y lmcache lmcache-core" in first
    report = json.loads(_cli(run_python, ["devices", "--json"], path).stdout)
    assert any(d.startswith("lmcache-core: problem: upstream") for d in report["diagnoses"])
