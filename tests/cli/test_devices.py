"""``lmcache devices`` reports backends, skipped plugins and the selection."""

from __future__ import annotations

import json
from typing import Any

DEVICES = "import sys\nfrom lmcache.cli.main import main\nsys.exit(main({argv!r}))"


def test_devices_json_lists_cpu_and_selection(run_python: Any) -> None:
    proc = run_python(DEVICES.format(argv=["devices", "--json"]))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    names = {b["backend_name"]: b for b in report["backends"]}
    assert names["cpu"]["source"].startswith("in-tree")
    assert names["cpu"]["available"] is True
    assert report["selected"]["device_type"] == "cpu"
    assert report["selected"]["reason"]
    for backend in report["backends"]:
        assert set(backend) >= {
            "source",
            "device_type",
            "available",
            "priority",
            "ops",
            "transfer_modes",
        }


def test_devices_reports_unusable_explicit_choice(run_python: Any) -> None:
    proc = run_python(DEVICES.format(argv=["devices"]), {"LMCACHE_DEVICE_BACKEND": "nope"})
    assert proc.returncode == 1
    assert "LMCACHE_DEVICE_BACKEND='nope' is not registered" in proc.stdout


def test_help_lists_commands(run_python: Any) -> None:
    proc = run_python(DEVICES.format(argv=["--help"]))
    assert "devices" in proc.stdout and "bench" in proc.stdout
