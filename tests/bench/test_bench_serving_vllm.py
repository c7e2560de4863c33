"""CI smoke of ``lmcache bench serving``: two-layer model, real ``vllm serve``, seconds.

Runs in the ``vllm-e2e`` nox session (``-m vllm``), so the benchmark cannot rot; the full
matrix is a benchmark run, not a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prerequisites import require_module

require_module(
    "vllm",
    "vLLM is installed only in the vllm-e2e nox session (nox -s vllm-e2e)",
    required_env="LMCACHE_TEST_REQUIRE_VLLM",
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def test_quick_serving_run_measures_both_configurations(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "e2e" / "vllm"))
    from tiny_model import build

    model = build(tmp_path / "tiny-llama")
    out = tmp_path / "serving.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    result = subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", "bench", "serving", "--quick",
         "--model", str(model), "--chunk-size", "64", "--configs", "prefix,engine_driven",
         "--workloads", "chat", "--workdir", str(tmp_path / "work"), "--json", str(out)],
        capture_output=True, text=True, timeout=840, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    doc = json.loads(out.read_text())
    rows = {r["config"]: r for r in doc["results"]}
    assert set(rows) == {"prefix", "engine_driven"}
    for row in rows.values():
        assert row["errors"] == 0 and row["requests"] == 4, row
        assert row["ttft_p50_ms"] > 0 and row["request_throughput"] > 0
        assert row["binding"] == rows["prefix"]["binding"] and row["binding"] is not None
    counters = rows["engine_driven"]["counters"]
    # The connector was live: it looked the prompts up and stored their chunks.
    assert counters["lmcache_mp_lookup_tokens"] > 0, counters
    assert counters["lmcache_mp_stored_bytes"] > 0, counters
    assert rows["prefix"]["counters"]["lmcache_mp_lookup_tokens"] == 0
    assert doc["conditions"]["start"]["load_average"] is not None
    assert "| chat | 2.0 | engine_driven |" in result.stdout
