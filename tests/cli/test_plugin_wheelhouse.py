"""``lmcache plugin wheelhouse DIR`` writes the lmcache-core wheel a plugin repository
outside this checkout installs from, and what pip makes of a plugin written from the seed
guide (``dependencies = ["lmcache"]``) against that wheelhouse: refused, never a swapped
core; with ``lmcache-core`` it resolves, and installed as is (``--no-deps``) ``lmcache
plugin check`` names the fix.

Everything runs in a Python without lmcache (``nocore``), pip offline (``--no-index``, no
configuration): lmcache-core can only come from the wheelhouse.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from nocore import env_without_core
from prerequisites import require_module

import lmcache

# The seed guide's pyproject.toml, verbatim.
SEED_PYPROJECT = """[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "lmcache-foo-device"
version = "0.1.0"
dependencies = ["lmcache"]

[project.entry-points."lmcache.device_plugins"]
foo = "lmcache_foo.device:FooDeviceSpec"

[tool.setuptools.packages.find]
where = ["src"]
"""
SEED_DEVICE = """from lmcache.v1.platform.base.device_spec import DeviceSpec


class FooDeviceSpec(DeviceSpec):
    device_type = property(lambda self: "foo")
    backend_name = property(lambda self: "foo")
    torch_module_name = property(lambda self: "foo")
"""
FIX = 'dependencies = ["lmcache-core>=0.1,<0.2"] instead of "lmcache"'


def _run(argv: list[str | Path], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env_without_core(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    if check:
        assert proc.returncode == 0, f"{argv}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _plugin_wheel(tmp_path: Path, python: Path, wheelhouse: Path, dependency: str) -> Path:
    project = tmp_path / "seed"
    (project / "src" / "lmcache_foo").mkdir(parents=True)
    (project / "src" / "lmcache_foo" / "__init__.py").write_text("")
    (project / "src" / "lmcache_foo" / "device.py").write_text(SEED_DEVICE)
    pyproject = SEED_PYPROJECT.replace('["lmcache"]', f'["{dependency}"]')
    (project / "pyproject.toml").write_text(pyproject)
    _run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", wheelhouse,
          project], tmp_path)  # fmt: skip
    return next(wheelhouse.glob("lmcache_foo_device-*.whl"))


def _dry_run(python: Path, wheelhouse: Path, cwd: Path, *reqs: str) -> Any:
    proc = _run([python, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                 "--find-links", wheelhouse, *reqs], cwd, check=False)  # fmt: skip
    return proc if proc.returncode != 0 else json.loads(proc.stdout)


@pytest.fixture
def wheelhouse(core_wheelhouse: Path, tmp_path: Path) -> Path:
    """A copy of the session's core wheelhouse that a test may add plugin wheels to."""
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    for wheel in core_wheelhouse.glob("*.whl"):
        (folder / wheel.name).write_bytes(wheel.read_bytes())
    return folder


def test_the_wheelhouse_holds_the_core_wheel(core_wheelhouse: Path) -> None:
    (wheel,) = core_wheelhouse.glob("*.whl")
    assert wheel.name == f"lmcache_core-{lmcache.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"lmcache_core-{lmcache.__version__}.dist-info"
        assert {"lmcache/__init__.py", "lmcache/testing/conftest.py", f"{info}/RECORD"} <= names
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        assert "lmcache = lmcache.cli.main:main" in entry_points
        assert "Provides-Extra: testing" in archive.read(f"{info}/METADATA").decode()
        assert not any(name.endswith(".pyc") for name in names)


def test_the_core_and_its_testing_extra_resolve_from_it(
    python_without_core: Path, wheelhouse: Path, tmp_path: Path
) -> None:
    report = _dry_run(python_without_core, wheelhouse, tmp_path, "lmcache-core[testing]")
    urls = {item["metadata"]["name"]: item["download_info"]["url"] for item in report["install"]}
    wheel = wheelhouse / f"lmcache_core-{lmcache.__version__}-py3-none-any.whl"
    assert urls == {"lmcache-core": wheel.as_uri()}


def test_the_wheel_installs_runs_and_repacks_itself(
    python_without_core: Path, core_wheelhouse: Path, tmp_path: Path
) -> None:
    (wheel,) = core_wheelhouse.glob("*.whl")
    _run([python_without_core, "-m", "pip", "install", "--no-deps", wheel], tmp_path)
    out = _run([python_without_core, "-m", "lmcache.cli.main", "plugin", "wheelhouse",
                tmp_path / "again"], tmp_path).stdout  # fmt: skip
    assert "export LMCACHE_WHEELHOUSE=" in out
    # Installed from a wheel there is no source tree: the installed files are packed.
    (again,) = (tmp_path / "again").glob("*.whl")
    with zipfile.ZipFile(wheel) as first, zipfile.ZipFile(again) as second:
        assert set(first.namelist()) == set(second.namelist())
        assert first.read("lmcache/__init__.py") == second.read("lmcache/__init__.py")


@pytest.mark.scaffold
def test_a_seed_verbatim_plugin_is_refused_never_swaps_the_core(
    python_without_core: Path, wheelhouse: Path, tmp_path: Path
) -> None:
    require_module("setuptools", "builds the plugin wheels")
    _plugin_wheel(tmp_path, python_without_core, wheelhouse, "lmcache")
    refused = _dry_run(python_without_core, wheelhouse, tmp_path, "lmcache-foo-device")
    assert isinstance(refused, subprocess.CompletedProcess), refused
    assert "No matching distribution found for lmcache (from lmcache-foo-device)" in refused.stderr
    # Installed as is next to the core, lmcache plugin check names the fix.
    core = next(wheelhouse.glob("lmcache_core-*.whl"))
    seed = next(wheelhouse.glob("lmcache_foo_device-*.whl"))
    _run([python_without_core, "-m", "pip", "install", "--no-deps", core, seed], tmp_path)
    check = _run([python_without_core, "-m", "lmcache.cli.main", "plugin", "check", "foo"],
                 tmp_path, check=False)  # fmt: skip
    assert check.returncode == 1, check.stdout + check.stderr
    assert "foo: problem: lmcache-foo-device 0.1.0 requires 'lmcache'" in check.stdout
    assert FIX in check.stdout


@pytest.mark.scaffold
def test_with_lmcache_core_the_plugin_resolves_from_the_wheelhouse(
    python_without_core: Path, wheelhouse: Path, tmp_path: Path
) -> None:
    require_module("setuptools", "builds the plugin wheels")
    _plugin_wheel(tmp_path, python_without_core, wheelhouse, "lmcache-core>=0.1,<0.2")
    report = _dry_run(python_without_core, wheelhouse, tmp_path, "lmcache-foo-device")
    assert not isinstance(report, subprocess.CompletedProcess), report.stderr
    names = {item["metadata"]["name"]: item["download_info"]["url"] for item in report["install"]}
    assert set(names) == {"lmcache-core", "lmcache-foo-device"}
    assert all(url.startswith(wheelhouse.as_uri()) for url in names.values())
