"""``lmcache bench storage --quick`` (local tiers by default) runs end to end (numbers not
asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from prerequisites import require_module

from lmcache.bench import report, storage

ROW_KEYS = {"backend", "op", "chunk_mib", "chunks", "tier_gbps", "raw_gbps", "ratio"}


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    storage.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_quick_default_bench_runs_local_tiers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    args = _parse("--quick", "--json", str(out), "--dir", str(tmp_path))
    assert storage.run(args) == 0
    document = json.loads(out.read_text())
    assert document["benchmark"] == "storage"
    assert document["config"]["backend"] == "local" and document["config"]["quick"] is True
    rows = document["results"]
    assert [(r["backend"], r["op"]) for r in rows] == [
        ("cpu", "put"),
        ("cpu", "get"),
        ("disk", "put"),
        ("disk", "get"),
    ]
    assert all(set(r) == ROW_KEYS for r in rows)
    assert all(r["tier_gbps"] > 0 and r["raw_gbps"] > 0 for r in rows)
    lookup = document["lookup"]
    assert lookup["hits"] == lookup["keys"] and lookup["keys_per_s"] > 0
    assert "keys/s" in capsys.readouterr().out
    markdown = report.render(str(out), document)
    assert "lmcache bench storage" in markdown and "lookup: keys" in markdown


def test_local_tiers_are_registered_and_default() -> None:
    assert {"cpu", "disk", "local", "redis"} <= set(storage.BACKENDS)
    assert _parse().backend == "local"
    assert _parse("--backend", "disk").backend == "disk"


def test_plot_writes_a_png(tmp_path: Path) -> None:
    require_module("matplotlib", "--plot needs matplotlib (pip install 'lmcache-core[plot]')")
    png = tmp_path / "storage.png"
    assert storage.run(_parse("--backend", "cpu", "--quick", "--plot", str(png))) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
