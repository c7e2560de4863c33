"""`lmcache bench ops --quick` runs and reports every layout family (a smoke test, no timing)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from lmcache.bench import ops as bench_ops


def test_quick_run_writes_every_family(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    bench_ops.add_arguments(parser)
    out = tmp_path / "ops.json"
    args = parser.parse_args(["--quick", "--backend", "torch", "--json", str(out)])
    assert bench_ops.run(args) == 0
    payload = json.loads(out.read_text())
    families = {r["family"] for r in payload["results"]}
    assert families == {f for f, _ in bench_ops.FAMILIES}
    assert all(r["memcpy_gbps"] > 0 and r["candidate_gbps"] > 0 for r in payload["results"])
    assert "cand/memcpy" in capsys.readouterr().out
