"""The wheel as a device plugin: discovered, not available without a GPU, skipped cleanly."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

RunPython = Callable[..., subprocess.CompletedProcess[str]]

REPORT = """
    import json, logging
    logging.basicConfig(level=logging.WARNING)
    from lmcache.v1.platform.registry import get_registry, get_selection
    registry = get_registry()
    names = registry.backends
    print(json.dumps({
        "selected": get_selection().backend.backend_name,
        "cuda": [names["cuda"].spec.device_type, names["cuda"].spec.is_available()],
        "rocm": [names["rocm"].spec.device_type, names["rocm"].spec.is_available()],
    }))
"""


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def test_entry_points_name_both_backends() -> None:
    eps = {
        ep.name: ep
        for ep in importlib.metadata.entry_points(group="lmcache.device_plugins")
        if ep.value.startswith("lmcache_cuda.")
    }
    assert set(eps) == {"cuda", "rocm"}
    for name, ep in eps.items():
        spec = ep.load()()
        assert spec.backend_name == name
        assert spec.device_type == "cuda" and spec.torch_module_name == "cuda"
        assert spec.is_lmcache_driven_available()


def test_cuda_and_rocm_never_both_available() -> None:
    from lmcache_cuda.device import CudaDeviceSpec, RocmDeviceSpec

    assert not (CudaDeviceSpec().is_available() and RocmDeviceSpec().is_available())


@pytest.mark.skipif(not _no_gpu(), reason="checks the no-GPU behaviour")
def test_discovered_but_unavailable_so_cpu_stays_selected(run_python: RunPython) -> None:
    report = _json(run_python(REPORT))
    assert report["cuda"] == ["cuda", False]
    assert report["rocm"] == ["cuda", False]
    assert report["selected"] in ("cpu", "cpu_native")


@pytest.mark.skipif(not _no_gpu(), reason="checks the no-GPU behaviour")
def test_explicit_cuda_backend_fails_loudly_without_a_gpu(run_python: RunPython) -> None:
    proc = run_python(
        "from lmcache.v1.platform.registry import get_selection; get_selection()",
        {"LMCACHE_DEVICE_BACKEND": "cuda"},
    )
    assert proc.returncode != 0
    assert "not available" in proc.stderr


def test_importing_the_package_and_spec_loads_no_cuda_code(run_python: RunPython) -> None:
    proc = run_python(
        """
        import sys
        import lmcache_cuda, lmcache_cuda.device
        from lmcache.v1.platform.registry import get_registry
        get_registry()
        print(sorted(m for m in sys.modules if m.startswith("lmcache_cuda")))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['lmcache_cuda', 'lmcache_cuda.device']"


@pytest.mark.skipif(not _no_gpu(), reason="checks the no-GPU behaviour")
def test_ops_without_a_gpu_warn_once_and_stay_on_the_baseline(run_python: RunPython) -> None:
    proc = run_python(
        """
        import json, logging
        logging.basicConfig(level=logging.WARNING)
        from lmcache_cuda.device import CudaDeviceSpec
        from lmcache_cuda.device_ops import CudaDeviceOps
        ops = CudaDeviceSpec().get_ops()
        CudaDeviceOps().ensure_native()  # a second ops object: no second warning
        print(json.dumps({"native": ops.native_module_name,
                          "op": ops.multi_layer_block_kv_transfer.__func__.__module__}))
        """
    )
    report = _json(proc)
    assert report == {"native": None, "op": "lmcache.v1.platform.base.device_ops"}
    assert proc.stderr.count("stays on the torch baseline") == 1, proc.stderr


def test_rocm_ops_never_bind_the_cuda_extension() -> None:
    from lmcache_cuda.device_ops import RocmDeviceOps

    ops = RocmDeviceOps()
    ops.ensure_native()
    assert ops.native_module_name is None


def test_event_ipc_backend_is_cached_default_backend() -> None:
    import torch

    from lmcache.v1.platform.base.event_ipc import DefaultEventIPCBackend
    from lmcache_cuda.device import CudaDeviceSpec

    spec = CudaDeviceSpec()
    backend = spec.event_ipc_backend
    assert isinstance(backend, DefaultEventIPCBackend)
    assert backend.event_module is torch.cuda and backend.device_type == "cuda"
    assert spec.event_ipc_backend is backend


@pytest.mark.skipif(not _no_gpu(), reason="checks the no-GPU behaviour")
def test_pinning_reports_unsupported_without_a_gpu() -> None:
    from lmcache_cuda.device import CudaDeviceSpec

    spec = CudaDeviceSpec()
    assert spec.pin_memory_backend is not None
    assert spec.is_pin_supported is False
    assert spec.pin_memory(0x1000, 4096) is False


def test_wrapper_wire_round_trip_without_a_gpu() -> None:
    import torch

    from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
    from lmcache_cuda.device import CudaDeviceSpec

    wrapper_cls = CudaDeviceSpec().ipc_wrapper_cls
    handle = (0, b"\x01" * 64, 4096, 0, b"ref", 8, b"\x02" * 64, True)
    wrapper = wrapper_cls(handle, torch.bfloat16, (2, 4, 8), (32, 8, 1), 0, "GPU-1234")
    blob = DeviceIPCWrapper.Serialize(wrapper)
    back = DeviceIPCWrapper.Deserialize(blob)
    assert type(back) is wrapper_cls and back == wrapper
    assert wrapper.to_wire().__struct_config__.tag == "cuda"


def test_extension_has_no_torch_dependency() -> None:
    try:
        import lmcache_cuda._native as native
    except ImportError as exc:
        pytest.skip(f"wheel built without nvcc (no native extension): {exc}")
    path = Path(native.__file__)
    if not shutil.which("readelf"):
        pytest.skip("readelf is not available")
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    needed = [line for line in out.splitlines() if "(NEEDED)" in line]
    assert needed, "expected at least libc among the dynamic dependencies"
    joined = "\n".join(needed).lower()
    for lib in ("libtorch", "libc10", "libcudart", "libpython"):
        assert lib not in joined, f"{path.name} depends on {lib}: {joined}"


def test_native_module_imports_and_sees_no_device_here() -> None:
    try:
        import lmcache_cuda._native as native
    except ImportError as exc:
        pytest.skip(f"wheel built without nvcc (no native extension): {exc}")
    assert "90" in native.COMPILED_ARCHS
    if _no_gpu():
        assert native.device_count() == 0
        assert native.device_address(0x1000) == 0


def test_logging_uses_module_loggers() -> None:
    from lmcache_cuda import device_ops

    assert device_ops.logger.name == "lmcache_cuda.device_ops"
    assert isinstance(device_ops.logger, logging.Logger)
    assert sys.modules["lmcache_cuda.device_ops"] is device_ops


def test_upstream_import_paths_resolve_to_this_plugins_classes() -> None:
    # Upstream 0.5.6 code and tests import these from its core; lmcache-core's thin modules
    # must hand out exactly this wheel's classes, not copies or wrappers.
    from lmcache.compat.upstream_056.devices.cuda import CudaDeviceSpec
    from lmcache.compat.upstream_056.devices.cuda.device_ops import CudaDeviceOps
    from lmcache.compat.upstream_056.devices.cuda.ipc_wrapper import CudaIPCWrapper
    from lmcache.compat.upstream_056.devices.cuda.pin_memory import CudaPinMemoryBackend
    from lmcache.compat.upstream_056.devices.rocm import RocmDeviceSpec
    from lmcache.compat.upstream_056.devices.rocm.pin_memory import RocmPinMemoryBackend
    from lmcache_cuda import device, device_ops, ipc_wrapper, pin_memory

    assert CudaDeviceSpec is device.CudaDeviceSpec
    assert RocmDeviceSpec is device.RocmDeviceSpec
    assert CudaDeviceOps is device_ops.CudaDeviceOps
    assert CudaIPCWrapper is ipc_wrapper.CudaIPCWrapper
    assert CudaPinMemoryBackend is pin_memory.CudaPinMemoryBackend
    assert RocmPinMemoryBackend is pin_memory.RocmPinMemoryBackend
