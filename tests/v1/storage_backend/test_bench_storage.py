"""``lmcache bench storage --backend local --quick`` runs end to end (numbers not asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from lmcache.bench import storage


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    storage.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_quick_local_bench_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    args = _parse("--backend", "local", "--quick", "--json", str(out), "--dir", str(tmp_path))
    assert storage.run(args) == 0
    data = json.loads(out.read_text())
    assert [(r["backend"], r["op"]) for r in data["results"]] == [
        ("cpu", "put"),
        ("cpu", "get"),
        ("disk", "put"),
        ("disk", "get"),
    ]
    assert all(r["tier_gbps"] > 0 and r["raw_gbps"] > 0 for r in data["results"])
    assert data["lookup"]["hits"] == data["lookup"]["keys"] and data["lookup"]["keys_per_s"] > 0
    assert "keys/s" in capsys.readouterr().out


def test_local_tiers_are_registered_backends() -> None:
    assert {"cpu", "disk", "local"} <= set(storage.BACKENDS)
    assert _parse("--backend", "disk").backend == "disk"
