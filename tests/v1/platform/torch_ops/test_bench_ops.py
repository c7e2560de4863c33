"""`lmcache bench ops --quick` runs and reports every layout family (a smoke test, no timing)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from prerequisites import require_module

from lmcache.bench import ops as bench_ops
from lmcache.bench import report

ROW_KEYS = {
    "family",
    "engine_kv_format",
    "direction",
    "bytes",
    "candidate_gbps",
    "baseline_gbps",
    "memcpy_gbps",
    "vs_baseline",
    "vs_memcpy",
}


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_ops.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_quick_run_writes_every_family(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ops.json"
    assert bench_ops.run(_parse("--quick", "--backend", "torch", "--json", str(out))) == 0
    document = json.loads(out.read_text())
    assert document["benchmark"] == "ops"
    assert document["config"]["backend"] == "torch" and document["config"]["quick"] is True
    assert document["summary"]["candidate"] == "torch_ops"
    rows = document["results"]
    assert {r["family"] for r in rows} == {f for f, _ in bench_ops.FAMILIES}
    assert all(set(r) == ROW_KEYS for r in rows)
    assert all(r["memcpy_gbps"] > 0 and r["candidate_gbps"] > 0 for r in rows)
    # The bound is a best case: no op over the same bytes beats it.
    assert all(r["memcpy_gbps"] >= r["baseline_gbps"] for r in rows), rows
    assert "cand/memcpy" in capsys.readouterr().out
    markdown = report.render(str(out), document)
    assert "lmcache bench ops" in markdown and "| family |" in markdown


def test_plot_writes_a_png(tmp_path: Path) -> None:
    require_module("matplotlib", "--plot needs matplotlib (pip install 'lmcache-core[plot]')")
    png = tmp_path / "ops.png"
    args = _parse("--quick", "--backend", "torch", "--family", "mla", "--plot", str(png))
    assert bench_ops.run(args) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
