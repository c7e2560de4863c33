"""Scenario 1: upstream LMCache 0.5.6's MP adapters (``LMCacheMPWorkerAdapter`` and
``LMCacheMPSchedulerAdapter``) against **our** ``lmcache server``."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RunningServer, run_driver, server_stats


@pytest.mark.parametrize("mode", ["engine_driven", "lmcache_driven"])
def test_store_lookup_retrieve(
    upstream_python: Path, servers: dict[str, RunningServer], mode: str
) -> None:
    server = servers["ours"]
    errors_before = server_stats(server.url).errors
    result = run_driver(upstream_python, "upstream_driver.py", "--url", server.url, "--mode", mode)
    assert "error" not in result, result.get("traceback", result)
    if mode == "engine_driven":
        # CPU + auto on upstream = engine-driven; our server offers SHM -> SHM sub-path.
        assert result["engine_driven_context"] == "EngineDrivenContextShm", result
    else:
        # LMCache-driven via upstream's cpu_shm IPC wrapper (Ext code 1, tag cpu_shm).
        assert result["transfer_context"] == "LMCacheDrivenTransferContext", result
    assert result["store_ok"] is True
    assert result["lookup_hit_tokens"] == 128
    assert result["miss_hit_tokens"] == 0
    assert result["retrieve_ok"] is True
    assert result["bytes_equal"] is True
    assert server_stats(server.url).errors == errors_before, server.log_tail()


def test_pickle_sub_path_is_refused_clearly(
    upstream_python: Path, servers: dict[str, RunningServer]
) -> None:
    """Without SHM upstream's worker falls back to pickling chunks; we refuse before any
    data moves, and upstream's client surfaces our reason in its exception."""
    server = servers["ours_no_shm"]
    result = run_driver(
        upstream_python, "upstream_driver.py", "--url", server.url, "--mode", "engine_driven"
    )
    error = result.get("error", "")
    assert "unsupported_transfer_mode" in error, result
    assert "pickle sub-path" in error and "prepare_store" in error, error
