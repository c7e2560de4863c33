"""The wheel as a device plugin: discovery, priority selection, forced baseline, fail-soft."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lmcache.v1.platform.base.device_ops import DeviceOps

RunPython = Callable[..., subprocess.CompletedProcess[str]]

SELECTION = """
    import json, logging
    logging.basicConfig(level=logging.WARNING)
    from lmcache.v1.platform.registry import get_selection
    import lmcache
    selection = get_selection()
    ops = lmcache.device_ops
    print(json.dumps({
        "backend": selection.backend.backend_name,
        "reason": selection.reason,
        "ops_cls": type(ops).__name__,
        "native": ops.native_module_name,
        "symbols": list(ops.native_symbols),
        "op_module": getattr(ops.multi_layer_block_kv_transfer, "__module__", None),
        "kernels": type(getattr(getattr(ops.multi_layer_block_kv_transfer, "kv_ops", None),
                                "kernels", None)).__name__,
    }))
"""


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_spec_loads_no_native_code(run_python: RunPython) -> None:
    proc = run_python(
        """
        import sys
        import lmcache_cpu.device
        print(sorted(m for m in sys.modules if m.startswith("lmcache_cpu")))
        """
    )
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.strip()
    assert "lmcache_cpu.device" in loaded
    for heavy in ("_native", "_ops", "native_ops", "device_ops"):
        assert f"lmcache_cpu.{heavy}'" not in loaded, loaded


def test_selected_without_any_environment_variable(run_python: RunPython) -> None:
    report = _json(run_python(SELECTION))
    assert report["backend"] == "cpu_native"
    assert "highest priority" in report["reason"]
    assert report["ops_cls"] == "CpuNativeDeviceOps"
    assert report["native"] == "lmcache_cpu.native_ops"
    assert {"multi_layer_block_kv_transfer", "lmcache_memcpy_async", "StagingCopy"} <= set(
        report["symbols"]
    )
    assert report["op_module"] == "lmcache.v1.platform.kernel_kit.ops"
    assert report["kernels"] == "CpuKernels"


def test_forcing_the_in_tree_cpu_backend_keeps_the_baseline(run_python: RunPython) -> None:
    report = _json(run_python(SELECTION, {"LMCACHE_DEVICE_BACKEND": "cpu"}))
    assert report["backend"] == "cpu"
    assert report["native"] is None and report["symbols"] == []


def test_forcing_cpu_native_by_name(run_python: RunPython) -> None:
    report = _json(run_python(SELECTION, {"LMCACHE_DEVICE_BACKEND": "cpu_native"}))
    assert report["backend"] == "cpu_native" and report["native"] == "lmcache_cpu.native_ops"


def test_disabled_native_module_warns_once_and_keeps_the_baseline(run_python: RunPython) -> None:
    code = (
        SELECTION
        + """
    from lmcache_cpu.device_ops import CpuNativeDeviceOps
    CpuNativeDeviceOps().ensure_native()  # a second ops object: no second warning
    """
    )
    proc = run_python(code, {"LMCACHE_CPU_DISABLE_NATIVE": "1"})
    report = _json(subprocess.CompletedProcess(proc.args, 0, proc.stdout.splitlines()[0], ""))
    assert proc.returncode == 0, proc.stderr
    assert report["backend"] == "cpu_native" and report["native"] is None
    assert report["op_module"] is None or report["op_module"].startswith("lmcache.")
    assert proc.stderr.count("stays on the torch baseline") == 1, proc.stderr


def test_broken_extension_warns_once_and_keeps_the_baseline(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from lmcache_cpu import device_ops

    # A None entry in sys.modules makes `import lmcache_cpu._native` raise ImportError,
    # just like a missing or unloadable .so.
    for name in ("lmcache_cpu.native_ops", "lmcache_cpu._ops"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "lmcache_cpu._native", None)
    device_ops.load_native_ops.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="lmcache_cpu"):
            first, second = device_ops.CpuNativeDeviceOps(), device_ops.CpuNativeDeviceOps()
            first.ensure_native()
            second.ensure_native()
        warnings = [r for r in caplog.records if "stays on the torch baseline" in r.message]
        assert len(warnings) == 1
        assert first.native_module_name is None
        # The bound method is still the base class's delegation to torch_ops.
        assert first.multi_layer_block_kv_transfer.__func__ is (  # type: ignore[attr-defined]
            DeviceOps.multi_layer_block_kv_transfer
        )
    finally:
        device_ops.load_native_ops.cache_clear()


def test_lmcache_devices_json_shows_native_ops(run_python: RunPython) -> None:
    proc = run_python(
        "import sys; from lmcache.cli.main import main; sys.argv = ['lmcache', 'devices', "
        "'--json']; sys.exit(main())"
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    ours = next(b for b in report["backends"] if b["backend_name"] == "cpu_native")
    assert ours["ops"] == "native (lmcache_cpu.native_ops)"
    assert "multi_layer_block_kv_transfer" in ours["native_symbols"]
    assert report["selected"]["backend_name"] == "cpu_native"


def _extension_path() -> Path:
    import lmcache_cpu._native as native

    return Path(native.__file__)


def test_extension_does_not_link_libtorch() -> None:
    path = _extension_path()
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
        needed = [line for line in out.splitlines() if "(NEEDED)" in line]
    elif shutil.which("ldd"):
        needed = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout.split(
            "\n"
        )
    else:
        pytest.skip("neither readelf nor ldd is available")
    assert needed, "expected at least libc among the dynamic dependencies"
    joined = "\n".join(needed).lower()
    for lib in ("libtorch", "libc10", "libgomp", "libiomp", "libpython"):
        assert lib not in joined, f"{path.name} depends on {lib}: {joined}"
