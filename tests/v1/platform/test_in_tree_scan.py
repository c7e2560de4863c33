"""The in-tree scan path: sub-packages of lmcache.v1.platform define backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIXTURE_DIR = Path(__file__).parent / "intree_fixture"

SCAN = f"""
import json
import lmcache.v1.platform as platform
platform.__path__.append({str(FIXTURE_DIR)!r})
from lmcache.v1.platform.registry import build_registry, select_backend
registry = build_registry(env={{}})
print(json.dumps({{
    name: [b.source.kind, b.source.module, b.device_type]
    for name, b in registry.backends.items()
}} | {{"_selected": select_backend(registry, env={{}}).backend.backend_name}}))
"""


def test_in_tree_cpu_backend_is_registered(run_python_json: Any) -> None:
    result = run_python_json(
        "import json\nfrom lmcache.v1.platform.registry import build_registry\n"
        "r = build_registry(env={'LMCACHE_DEVICE_PLUGINS_AUTOLOAD': '0'})\n"
        "print(json.dumps({n: b.source.kind for n, b in r.backends.items()}))"
    )
    assert result == {"cpu": "in-tree"}


def test_in_tree_package_is_scanned_and_selected(run_python_json: Any) -> None:
    result = run_python_json(SCAN, {"LMCACHE_DEVICE_PLUGINS_AUTOLOAD": "0"})
    assert result["faketree"] == ["in-tree", "lmcache.v1.platform.faketree", "faketree"]
    # Defined-in-module specs are registered even if unavailable.
    assert result["faketree2"][0] == "in-tree"
    # An available accelerator type wins over cpu in auto-detection.
    assert result["_selected"] == "faketree"


def test_infrastructure_packages_are_not_scanned(run_python_json: Any) -> None:
    result = run_python_json(SCAN, {"LMCACHE_DEVICE_PLUGINS_AUTOLOAD": "0"})
    modules = {entry[1] for key, entry in result.items() if not key.startswith("_")}
    assert not any(m.endswith((".base", ".torch_ops")) for m in modules)
