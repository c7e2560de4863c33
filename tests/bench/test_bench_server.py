"""``lmcache bench server``: every path stores and retrieves what it stored.

The bench sizes L1 at 1.25x what the run stores; under the server's default 0.8 eviction
watermark that is exactly where ahead-of-need eviction starts, and the timed retrieves
became misses (an error from the worker) until the bench raised the watermark.  The sizes
here are above ``--quick``'s, whose run fits the 64 MiB minimum L1 and never showed it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmcache.cli.main import main


@pytest.mark.timeout(300)
def test_every_path_round_trips_and_the_run_records_its_conditions(tmp_path: Path) -> None:
    out = tmp_path / "server.json"
    argv = ["bench", "server", "--num-layers", "2", "--num-heads", "8", "--head-size", "64",
            "--chunk-size", "256", "--block-size", "16", "--chunks", "8", "--iters", "6",
            "--workers", "1", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    document = json.loads(out.read_text())
    rows = document["results"]
    assert {row["path"] for row in rows} == {
        "engine-driven SHM", "engine-driven inline", "LMCache-driven (CPU SHM)"
    }  # fmt: skip
    for row in rows:
        assert row["store_gbps"] > 0 and row["retrieve_gbps"] > 0, row
    started = document["conditions"]["start"]
    assert started["device_ops"].endswith("DeviceOps"), started
    assert started["torch_threads"] >= 1
    assert len(started["load_average"]) == 3
