"""``lmcache plugin new`` scaffolds a repository that builds, installs, passes
``lmcache plugin check``, is selected where asked for (its default priority displaces no
backend that is there already) and passes its own tests (the conformance suite) from a
fresh virtual environment; it refuses names that are taken, and the plugin logs inside
the ``lmcache`` logger tree.  (The repository's own ``nox -s tests`` from a wheelhouse
runs in tests/docs/test_plugin_guide.py, the vendor walk-through.)

The venv is created without pip and sees this interpreter's packages (torch, lmcache-core,
pip, the build backends) through a ``.pth`` line, so nothing is downloaded.  Under nox/CI
(``LMCACHE_TEST_REQUIRE_INSTALLED=1``) a missing build prerequisite fails instead of
skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import pytest
from nocore import env_without_core
from prerequisites import require_module, require_prerequisite

from lmcache.cli.scaffold import plugin_files
from lmcache.cli.scaffold.names import default_priority

# Backend selection must come from what is installed, not from the caller's environment.
_SELECTION_VARS = ("DEVICE_TYPE", "LMCACHE_DEVICE_BACKEND", "LMCACHE_DEVICE_PLUGINS_AUTOLOAD",
                   "LMCACHE_TESTING_BACKEND")  # fmt: skip


def clean_env(overrides: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SELECTION_VARS}
    return {**env, **overrides}


def _run(argv: list[str], cwd: Path, timeout: float = 600, **env: str) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=clean_env(env), capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def _scaffold(tmp_path: Path, *args: str) -> Path:
    project = tmp_path / "project"
    _run([sys.executable, "-m", "lmcache.cli.main", "plugin", "new", *args, "--output",
          str(project)], tmp_path)  # fmt: skip
    return project


def _fresh_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   tmp_path).strip()  # fmt: skip
    parent = sysconfig.get_paths()["purelib"]
    (Path(purelib) / "_parent_env.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    return python


def _build_and_install(tmp_path: Path, project: Path) -> Path:
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
          str(project / "dist"), str(project)], project)  # fmt: skip
    (wheel,) = (project / "dist").glob("*.whl")
    python = _fresh_venv(tmp_path)
    _run([str(python), "-m", "pip", "install", "--no-deps", str(wheel)], tmp_path)
    return python


def _selected(python: Path, cwd: Path, name: str, **env: str) -> dict[str, object]:
    argv = [str(python), "-m", "lmcache.cli.main", "devices", "--json"]
    report = json.loads(_run(argv, cwd, **env))
    # Only this backend's lines: under nox the broken registry test plugins are installed.
    mine = [line for line in report["diagnoses"] if line.startswith(f"{name}:")]
    assert mine == [], mine
    return report


@pytest.mark.scaffold
def test_cpu_plugin_builds_installs_is_selectable_and_certified(tmp_path: Path) -> None:
    require_module("setuptools", "builds the scaffolded wheel")
    project = _scaffold(tmp_path, "acme", "--device-type", "cpu")
    python = _build_and_install(tmp_path, project)
    out = _run([str(python), "-m", "lmcache.cli.main", "plugin", "check", "acme"], tmp_path)
    assert "acme = lmcache_acme.device:AcmeDeviceSpec (lmcache-acme 0.1.0): ok" in out
    # Priority -1: the in-tree cpu (0) stays selected until the vendor asks for acme.
    report = _selected(python, tmp_path, "acme")
    assert report["selected"]["backend_name"] != "acme"  # type: ignore[index]
    acme = next(b for b in report["backends"] if b["backend_name"] == "acme")  # type: ignore[attr-defined]
    assert acme["ops"] == "native (lmcache_acme.native_ops)" and acme["priority"] == -1
    asked = _selected(python, tmp_path, "acme", LMCACHE_DEVICE_BACKEND="acme")
    assert asked["selected"]["backend_name"] == "acme"  # type: ignore[index]
    # The scaffold's own tests: the conformance suite against the installed wheel.
    out = _run([str(python), "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"], project,
               LMCACHE_TESTING_EXAMPLES="15")  # fmt: skip
    assert "4 passed" in out, out


@pytest.mark.scaffold
def test_native_plugin_compiles_and_binds_its_extension(tmp_path: Path) -> None:
    require_module("scikit_build_core", "builds the --native scaffold")
    require_module("nanobind", "the --native scaffold's bindings")
    for tool in ("cmake", "c++"):
        require_prerequisite(tool, shutil.which(tool) is not None, "builds the --native scaffold")
    project = _scaffold(tmp_path, "vend", "--device-type", "cpu", "--native", "--priority", "100")
    assert (project / "CMakeLists.txt").exists() and (project / "csrc" / "module.cpp").exists()
    python = _build_and_install(tmp_path, project)
    _run([str(python), "-m", "lmcache.cli.main", "plugin", "check", "vend"], tmp_path)
    report = _selected(python, tmp_path, "vend")
    assert report["selected"]["backend_name"] == "vend"  # type: ignore[index]
    vend = next(b for b in report["backends"] if b["backend_name"] == "vend")  # type: ignore[attr-defined]
    assert vend["ops"] == "native (lmcache_vend.native_ops)"


@pytest.mark.scaffold
def test_accelerator_variant_is_not_available_on_a_cpu_host(tmp_path: Path) -> None:
    files = plugin_files("foo", "foo", native=False)
    assert 'foo = "lmcache_foo.device:FooDeviceSpec"' in files["pyproject.toml"]
    assert '"lmcache-core>=0.1,<0.2"' in files["pyproject.toml"]
    project = _scaffold(tmp_path, "foo")
    _run([sys.executable, "-m", "compileall", "-q", str(project)], tmp_path)
    code = (
        "from lmcache_foo.device import FooDeviceSpec as S; s = S(); "
        "print(s.is_available(), s.device_type, s.priority, s.ops_cls.device_type)"
    )
    path = os.pathsep.join([str(project / "src"), os.environ.get("PYTHONPATH", "")])
    out = _run([sys.executable, "-c", code], tmp_path, PYTHONPATH=path)
    assert out.split() == ["False", "foo", "0", "foo"]


@pytest.mark.parametrize(
    ("device_type", "priority"),
    [("cpu", -1), ("cuda", -1), ("foo", 0)],
)
def test_default_priority_displaces_no_known_backend(device_type: str, priority: int) -> None:
    # cpu: in-tree cpu 0, lmcache-cpu's cpu_native 10; cuda: lmcache-cuda's cuda/rocm 0.
    assert default_priority(device_type) == priority
    device = plugin_files("acme", device_type, native=False, priority=priority)[
        "src/lmcache_acme/device.py"
    ]
    assert f"return {priority}" in device


def test_priority_flag_is_the_vendors_choice(tmp_path: Path) -> None:
    project = _scaffold(tmp_path, "acme", "--device-type", "cpu", "--priority", "100")
    assert "return 100" in (project / "src" / "lmcache_acme" / "device.py").read_text()


def _plugin_new(
    tmp_path: Path, name: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lmcache.cli.main", "plugin", "new", name,
                           "--output", str(tmp_path / "x")], capture_output=True, text=True,
                          timeout=120, env=clean_env(env or {}))  # fmt: skip


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("cpu", "the in-tree backend (lmcache.v1.platform.cpu) is named 'cpu'"),
        ("cpu_native", "the backend of our lmcache-cpu plugin is named 'cpu_native'"),
        ("cuda", "lmcache-cuda is our CUDA/ROCm plugin's distribution"),
        ("rocm", "a backend of our lmcache-cuda plugin is named 'rocm'"),
        ("core", "lmcache-core is this core's distribution"),
    ],
)
def test_names_of_our_backends_and_distributions_are_refused(
    tmp_path: Path, name: str, reason: str
) -> None:
    proc = _plugin_new(tmp_path, name)
    assert proc.returncode == 1
    # Log lines of the registry (e.g. about nox's deliberately broken test plugins) may
    # come first; the command's own error is the one line that is not a log record.
    (error,) = [line for line in proc.stderr.splitlines() if not line.startswith("[")]
    assert error.startswith(f"lmcache plugin new: error: backend name {name!r} is taken: ")
    assert reason in error
    assert not (tmp_path / "x").exists()


def test_names_of_installed_backends_and_distributions_are_refused(
    tmp_path: Path, installed_plugins: Callable[..., str]
) -> None:
    path = installed_plugins("good")  # backend fakegood of lmcache-testplugin-good
    proc = _plugin_new(tmp_path, "fakegood", {"PYTHONPATH": path})
    assert proc.returncode == 1 and "the installed backend 'fakegood'" in proc.stderr, proc.stderr
    # lmcache-testplugin-good is installed: `plugin new testplugin_good` would collide.
    proc = _plugin_new(tmp_path, "testplugin_good", {"PYTHONPATH": path})
    assert proc.returncode == 1
    assert "the distribution lmcache-testplugin-good 0.0.1 is installed" in proc.stderr


def test_scaffolded_plugin_logs_in_the_lmcache_tree(
    tmp_path: Path, dist_info: Callable[..., None]
) -> None:
    project = _scaffold(tmp_path, "acme", "--device-type", "cpu")
    site = tmp_path / "site"
    dist_info(site, "lmcache-acme", {"acme": "lmcache_acme.device:AcmeDeviceSpec"})
    path = os.pathsep.join([str(site), str(project / "src"), os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": path, "LMCACHE_ACME_DISABLE_NATIVE": "1"}

    def devices(*flags: str, **extra: str) -> str:
        argv = [sys.executable, "-m", "lmcache.cli.main", *flags, "devices"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                              env=clean_env({**env, **extra}))  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    needle = "AcmeDeviceOps stays on the torch baseline"
    (line,) = [line for line in devices().splitlines() if needle in line]
    assert "LMCache WARNING:" in line and "lmcache.plugins.lmcache_acme.device_ops" in line
    assert needle not in devices("--log-level", "ERROR")
    assert needle not in devices(LMCACHE_LOG_LEVEL="ERROR")


@pytest.mark.parametrize("name", ["Foo", "1x", "foo-bar", ""])
def test_bad_names_are_one_line_errors(tmp_path: Path, name: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "lmcache.cli.main", "plugin", "new", name,
                           "--output", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith("lmcache plugin new: error: backend name")
    assert not (tmp_path / "x").exists()


def test_refuses_a_non_empty_output(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "lmcache.cli.main", "plugin", "new", "acme",
                           "--output", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "is not empty" in proc.stderr


def _scaffold_nox(project: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nox", "-s", "tests"], cwd=project,
                          env=env_without_core(env), capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_scaffold_nox_names_the_missing_wheelhouse_before_installing(tmp_path: Path) -> None:
    require_module("nox", "runs the scaffold's noxfile")
    project = _scaffold(tmp_path, "acme", "--device-type", "cpu")
    unset = _scaffold_nox(project)
    out = unset.stdout + unset.stderr
    assert unset.returncode != 0 and "LMCACHE_WHEELHOUSE is not set" in out, out
    assert "pip install" not in out  # fails before the 1.5 minutes of installs
    (tmp_path / "empty").mkdir()
    empty = _scaffold_nox(project, LMCACHE_WHEELHOUSE=str(tmp_path / "empty"))
    out = empty.stdout + empty.stderr
    assert empty.returncode != 0 and "holds no lmcache_core-*.whl" in out, out
    ci = (project / ".github" / "workflows" / "ci.yml").read_text()
    assert "LMCACHE_WHEELHOUSE: ${{ github.workspace }}/wheelhouse" in ci
