"""``lmcache bench report`` renders ops, storage and server ``--json`` documents together."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from lmcache.bench import _output, report

DOCUMENTS = {
    "ops": (
        [{"family": "mla", "direction": "D2H", "bytes": 1024, "candidate_gbps": 1.5,
          "vs_memcpy": 0.5}],
        {"summary": {"candidate": "torch_ops", "threads": 2}},
    ),
    "storage": (
        [{"backend": "cpu", "op": "put", "tier_gbps": 2.0, "raw_gbps": 4.0, "ratio": 0.5}],
        {"lookup": {"keys": 8, "hits": 8, "round_trips": 0}},
    ),
    "server": (
        [{"path": "engine-driven SHM", "workers": 1, "store_gbps": 3.0, "store_ratio": 0.25}],
        {},
    ),
}  # fmt: skip


def test_report_renders_every_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for name, (rows, extra) in DOCUMENTS.items():
        path = tmp_path / f"{name}.json"
        _output.write_json(str(path), name, argparse.Namespace(quick=True), rows, **extra)
        files.append(str(path))
    assert report.run(argparse.Namespace(files=files, output=None)) == 0
    out = capsys.readouterr().out
    for name in DOCUMENTS:
        assert f"### `lmcache bench {name}`" in out
    assert "| mla | D2H | 1,024 | 1.50 | 0.50 |" in out
    assert "summary: candidate torch_ops, threads 2" in out
    assert "lookup: keys 8, hits 8, round_trips 0" in out
    assert "| engine-driven SHM | 1 | 3.00 | 0.25 |" in out


def test_report_rejects_other_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"config": {}}))
    assert report.run(argparse.Namespace(files=[str(path)], output=None)) == 2
    assert "no 'results' list" in capsys.readouterr().out
