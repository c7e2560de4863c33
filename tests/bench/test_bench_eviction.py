"""``lmcache bench eviction``: every policy replays the trace, ARC beats LRU on it, and the
uniform JSON document is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_small_run_compares_the_policies_and_writes_the_bench_document(tmp_path: Path) -> None:
    out = tmp_path / "eviction.json"
    result = subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", "bench", "eviction", "--rounds", "6",
         "--chunk-kib", "4", "--repeats", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, LMCACHE_LOG_LEVEL="WARNING"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(out.read_text())
    assert document["benchmark"] == "eviction"
    rows = {row["policy"]: row for row in document["results"]}
    assert set(rows) == {"LRU", "FIFO", "LFU", "MRU", "ARC", "IsolatedLRU"}
    assert rows["ARC"]["hit_rate"] >= rows["LRU"]["hit_rate"] + 0.1
    assert rows["LRU"]["time_vs_lru"] == 1.0 and rows["LRU"]["evictions"] > 0
    assert "ARC" in result.stdout and "us/miss" in result.stdout


def test_bad_sizes_are_refused(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", "bench", "eviction", "--capacity", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "--capacity must be positive" in result.stderr
