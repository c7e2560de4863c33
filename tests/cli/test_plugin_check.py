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


SLOW_SPEC = """
    import os
    import time
    from lmcache.v1.platform import torch_ops
    from lmcache.v1.platform.cpu import CpuDeviceSpec
    from lmcache.v1.platform.cpu.device_ops import CpuDeviceOps

    class SlowOps(CpuDeviceOps):
        def multi_layer_block_kv_transfer(self, *args, **kwargs):
            time.sleep(0.05)  # a kernel ~20x slower than the baseline at these sizes
            return torch_ops.multi_layer_block_kv_transfer(*args, **kwargs)

    class Slow(CpuDeviceSpec):
        backend_name = property(lambda self: "slowcpu")
        priority = property(lambda self: int(os.environ.get("SLOW_PRIORITY", "100")))
        ops_cls = property(lambda self: SlowOps)
"""


def test_a_slower_backend_that_takes_over_is_a_warning(
    run_python: Any, installed_module: Callable[..., str]
) -> None:
    path = installed_module("slow_cpu", SLOW_SPEC, {"slowcpu": "slow_cpu:Slow"})
    proc = _cli(run_python, ["plugin", "check", "slowcpu"], path)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # a warning, not a problem
    (line,) = [line for line in proc.stdout.splitlines() if "slowcpu: warning:" in line]
    assert "selected over cpu (priority 100 > 0) but its multi_layer_block_kv_transfer" in line
    assert "x (D2H)" in line and "keep its priority below 0" in line


def test_below_the_other_backends_it_is_not_measured_unless_asked(
    run_python: Any, installed_module: Callable[..., str]
) -> None:
    path = installed_module("slow_cpu", SLOW_SPEC, {"slowcpu": "slow_cpu:Slow"})
    proc = _cli(run_python, ["plugin", "check", "slowcpu"], path, SLOW_PRIORITY="-1")
    assert proc.returncode == 0 and "(lmcache-inline-slow-cpu 0.0.1): ok" in proc.stdout
    assert "speed:" not in proc.stdout
    bench = _cli(run_python, ["plugin", "check", "slowcpu", "--bench"], path, SLOW_PRIORITY="-1")
    assert bench.returncode == 0, bench.stdout + bench.stderr
    lines = bench.stdout.splitlines()
    assert any(line.strip().startswith("speed: multi_layer_block_kv_transfer") for line in lines)
    rows = [line.split() for line in lines if line.strip().startswith(("D2H", "H2D"))]
    assert [row[0] for row in rows] == ["D2H", "H2D"]
    for row in rows:  # D2H  slowcpu 0.31  torch baseline 9.80  ratio 0.03x
        assert row[1] == "slowcpu" and row[3:5] == ["torch", "baseline"] and row[6] == "ratio"
        ratio = float(row[2]) / float(row[5])
        assert float(row[7].rstrip("x")) == pytest.approx(ratio, rel=0.05, abs=0.011)
