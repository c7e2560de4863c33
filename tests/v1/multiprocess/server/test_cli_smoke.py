"""Smoke runs of ``lmcache demo`` and ``lmcache bench server`` (correctness, not speed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mp_server_helpers import ServerProcess


def _lmcache(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LMCACHE_LOG_LEVEL="WARNING")
    return subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_demo_against_a_running_server(auto_server: ServerProcess) -> None:
    result = _lmcache("demo", "--url", auto_server.url, "--tokens", "100", "--layers", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "retrieved KV is bit-exact" in result.stdout
    assert "sub-path shm" in result.stdout
    assert "all checks passed" in result.stdout


def test_demo_reports_a_refused_path_as_skipped(server_factory: Any) -> None:
    server = server_factory("--supported-transfer-mode", "lmcache_driven")
    result = _lmcache("demo", "--url", server.url, "--tokens", "64", "--layers", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "engine_driven: SKIPPED" in result.stdout
    assert "all checks passed" not in result.stdout
    assert "checks passed on 1 of 2 paths; SKIPPED: engine_driven" in result.stdout


def test_bench_server_quick_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = _lmcache(
        "bench",
        "server",
        "--quick",
        "--paths",
        "engine-shm",
        "lmcache-driven",
        "--workers",
        "1",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "x memcpy" in result.stdout
    document = json.loads(out.read_text())
    assert document["benchmark"] == "server"
    rows = document["results"]
    assert {r["path"] for r in rows} == {"engine-driven SHM", "LMCache-driven (CPU SHM)"}
    assert all(r["store_gbps"] > 0 and r["retrieve_gbps"] > 0 for r in rows)


def test_bench_server_scaling_table(tmp_path: Path) -> None:
    """Two worker counts: the aggregate of each path beside N threads copying, in the JSON."""
    out = tmp_path / "scaling.json"
    result = _lmcache(
        "bench", "server", "--quick", "--paths", "engine-inline", "--workers", "1", "2",
        "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "scaling (aggregate of all workers)" in result.stdout
    assert "memcpy, N threads" in result.stdout
    scaling = json.loads(out.read_text())["scaling"]
    assert [(r["path"], r["workers"]) for r in scaling] == [
        ("engine-driven inline", 1),
        ("engine-driven inline", 2),
    ]
    assert all(r["memcpy_threads_gbps"] > 0 and r["store_gbps"] > 0 for r in scaling)
    assert all(r["store_x_memcpy_threads"] > 0 for r in scaling)
