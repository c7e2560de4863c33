"""``lmcache bench server --curve``: a keyed and a plaintext server in alternating rounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmcache.cli.main import main


@pytest.mark.timeout(300)
def test_curve_comparison_writes_both_servers_and_the_ratio(tmp_path: Path) -> None:
    out = tmp_path / "curve.json"
    argv = ["bench", "server", "--curve", "--quick", "--paths", "engine-inline",
            "--rounds", "1", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    document = json.loads(out.read_text())
    (row,) = document["results"]
    assert row["path"] == "engine-driven inline"
    assert row["curve_gbps"] > 0 and row["plaintext_gbps"] > 0
    assert row["ratio"] == pytest.approx(row["curve_gbps"] / row["plaintext_gbps"])


def test_curve_and_metrics_overhead_exclude_each_other() -> None:
    assert main(["bench", "server", "--curve", "--metrics-overhead", "--quick"]) == 1
