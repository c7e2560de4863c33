"""``lmcache bench prefetch --quick``: both modes measured on the disk tier, the uniform JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_quick_run_measures_both_modes_and_writes_the_bench_document(tmp_path: Path) -> None:
    out = tmp_path / "prefetch.json"
    result = subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", "bench", "prefetch", "--quick", "--no-redis",
         "--gaps-ms", "0,5", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, LMCACHE_LOG_LEVEL="WARNING"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(out.read_text())
    assert document["benchmark"] == "prefetch"
    assert {"lmcache_version", "created", "config"} <= set(document)
    rows = document["results"]
    assert {(r["tier"], r["gap_ms"], r["mode"]) for r in rows} == {
        ("disk", gap, mode) for gap in (0.0, 5.0) for mode in ("sync", "prefetch")
    }
    for row in rows:
        assert row["lookup_ms"] > 0 and row["retrieve_ms"] > 0
        assert row["lookup_to_data_ms"] >= row["retrieve_ms"]
    assert "disk        0 |" in result.stdout  # the table, one line per tier and gap
