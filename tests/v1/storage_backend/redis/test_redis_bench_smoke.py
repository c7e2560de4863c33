"""``lmcache bench storage --backend redis --quick`` runs and reports one lookup round trip."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from redis_servers import RedisServer

pytestmark = pytest.mark.redis


def test_bench_storage_redis_quick(redis_server: RedisServer, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lmcache.cli.main",
            "bench",
            "storage",
            "--backend",
            "redis",
            "--quick",
            "--url",
            redis_server.url,
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tier/raw" in proc.stdout
    result = json.loads(out.read_text())
    assert result["lookup"]["round_trips"] == 1
    assert {r["op"] for r in result["results"]} == {"put", "get"}
