"""``lmcache bench storage --serde`` runs end to end (numbers not asserted, only that the
lossless serde is exact and the lossy ones save bytes)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from prerequisites import require_module

from lmcache.bench import storage

require_module(
    "cryptography", "the aesgcm serde needs cryptography (pip install 'lmcache-core[encryption]')"
)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    storage.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_quick_serde_bench(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "serde.json"
    args = _parse("--quick", "--serde", "all", "--serde", '{"type": "fp8"}', "--json", str(out),
                  "--dir", str(tmp_path))  # fmt: skip
    assert storage.run(args) == 0
    rows = {r["serde"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"fp8", "fp8-e5m2", "asym_k16_v8", "aesgcm", "multi", "fp8#2"}
    assert rows["aesgcm"]["max_abs_err"] == 0.0 and rows["aesgcm"]["cipher_gbps"] > 0
    assert rows["fp8"]["saved_pct"] > 45 and rows["asym_k16_v8"]["saved_pct"] > 20
    assert rows["fp8"]["max_abs_err"] > 0
    assert all(r["copy_gbps"] > 0 and r["disk_get_gbps"] > 0 for r in rows.values())
    assert "stored %" in capsys.readouterr().out


def test_bad_serde_spec_is_refused() -> None:
    with pytest.raises(SystemExit):
        _parse("--serde", "zstd")
    with pytest.raises(SystemExit):
        _parse("--serde", '{"fp8_dtype": "x"}')
