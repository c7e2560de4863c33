"""lmcache.torch_dev / torch_device_type / device_ops and the startup log line."""

from __future__ import annotations

from typing import Any

CODE = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import lmcache
before = sorted(m for m in sys.modules if m.startswith(("lmcache_", "lmcache.v1.platform.torch")))
ops = lmcache.device_ops
print(json.dumps({
    "before": before,
    "torch_dev": getattr(lmcache.torch_dev, "__name__", str(lmcache.torch_dev)),
    "type": lmcache.torch_device_type,
    "ops_cls": type(ops).__name__,
    "same": ops is lmcache.device_ops,
}))
"""


def test_lazy_package_attributes(run_python: Any) -> None:
    import json

    proc = run_python(CODE)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["before"] == [], "importing lmcache must not import ops or plugins"
    assert result["type"] == "cpu"
    assert result["torch_dev"] == "torch.cpu"
    assert result["same"] is True
    assert "torch_dev=torch.cpu, torch_device_type=cpu" in proc.stderr
    assert "LMCache device backend" in proc.stderr and "selected" in proc.stderr


def test_forcing_the_in_tree_cpu_backend(run_python_json: Any) -> None:
    result = run_python_json(
        "import json, lmcache; print(json.dumps(type(lmcache.device_ops).__name__))",
        {"LMCACHE_DEVICE_BACKEND": "cpu"},
    )
    assert result == "CpuDeviceOps"
