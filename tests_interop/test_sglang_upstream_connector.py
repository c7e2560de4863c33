"""Upstream's own SGLang connector (``lmcache==0.5.6``'s ``UnifiedLMCacheMPConnector``, the
class ``sglang --enable-lmcache`` builds) on SGLang's real CPU KV pool against **our**
server: store, lookup, load bit-exact into a second instance; and our connector loads the
chunks upstream's stored (same keys, same chunk bytes)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    ROOT,
    RunningServer,
    _wait_ready,
    free_port,
    our_server_cmd,
    run_driver,
    start,
    stop,
)
from prerequisites import missing_prerequisite

UPSTREAM_SGLANG_PYTHON = Path(
    os.environ.get("LMCACHE_UPSTREAM_SGLANG_PYTHON")
    or ROOT / ".venv-sglang-upstream" / "bin" / "python"
)
STUBS = ROOT / "e2e" / "sglang" / "stubs"
PAGE = 16


@pytest.fixture
def our_server(tmp_path: Path) -> Any:
    port = free_port()
    server: RunningServer = start(our_server_cmd(port), port, tmp_path / "ours.log")
    try:
        _wait_ready(server, 120)
        yield server
    finally:
        stop(server)


@dataclasses.dataclass
class _Pool:  # SGLang's MHATokenToKVPool as our connector reads it
    k_buffer: list[torch.Tensor]
    v_buffer: list[torch.Tensor]

    def get_kvcache(self) -> Any:
        return self


def _our_connector(config: Path, pool: _Pool) -> Any:
    from lmcache.integration.sglang.unified_lmcache_mp_connector import (
        UnifiedLMCacheMPConnector,
    )

    return UnifiedLMCacheMPConnector(
        config_file=str(config), model_config=type("M", (), {"model_path": "interop-model"})(),
        tp_size=1, tp_rank=0, tp_group=None, page_size=PAGE, token_to_kv_pool_allocator=pool,
        req_to_token_pool=None, tree_components=(type("C", (), {"name": "FULL"})(),),
        mamba_component=None, sliding_window_size=None,
    )  # fmt: skip


@pytest.mark.timeout(300)
def test_upstream_sglang_connector_on_our_server(our_server: RunningServer, tmp_path: Path) -> None:
    if not UPSTREAM_SGLANG_PYTHON.exists():
        missing_prerequisite(
            "SGLang + lmcache==0.5.6",
            "no such environment (LMCACHE_UPSTREAM_SGLANG_PYTHON); run nox -s sglang-cpu "
            "before nox -s interop-upstream",
        )
    result = run_driver(
        UPSTREAM_SGLANG_PYTHON, "sglang_upstream_driver.py",
        "--port", str(our_server.port), "--workdir", str(tmp_path), timeout=240,
        extra_env={"PYTHONPATH": str(STUBS), "SGLANG_USE_CPU_ENGINE": "1"},
    )  # fmt: skip
    assert "error" not in result, result.get("traceback", result)
    assert result["lmcache_file"].startswith(str(UPSTREAM_SGLANG_PYTHON.parent.parent)), result
    assert result["lmcache_version"] == "0.5.6"
    assert result["stored"] and result["prepared"] and result["loaded"], result
    assert result["hit"] == len(result["tokens"]) == 128
    assert result["bit_exact"], "upstream's reader did not get the writer's KV back"

    # Our connector, a third instance, loads what upstream's stored.
    planes = torch.load(tmp_path / "planes.pt")
    pool = _Pool(
        [torch.zeros(16 * PAGE + PAGE, 2, 8, dtype=torch.bfloat16) for _ in range(2)],
        [torch.zeros(16 * PAGE + PAGE, 2, 8, dtype=torch.bfloat16) for _ in range(2)],
    )
    config = tmp_path / "ours.yaml"
    config.write_text(f"mp_host: 127.0.0.1\nmp_port: {our_server.port}\n")
    ours = _our_connector(config, pool)
    try:
        lookup = ours.submit_lookup("ours", result["tokens"], local_hit_tokens=0, cache_salt="")
        deadline = time.monotonic() + 10
        while (hit := ours.poll_lookup(lookup)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert hit == 128
        target = torch.arange(4 * PAGE, 12 * PAGE)
        load = ours.submit_load(lookup, [target], local_hit_tokens=0)
        assert ours.complete_load(load)
        for got, want in zip([*pool.k_buffer, *pool.v_buffer], planes, strict=True):
            assert torch.equal(got[target], want)
    finally:
        ours.close()
