"""The connector with SGLang 0.5.23's real classes (no model): its radix cache imports our
modules, and its real CPU KV pool round-trips through a real ``lmcache server``.

SGLang is installed only in the ``sglang-cpu`` nox session (e2e/sglang/install.py), which
runs this file with ``LMCACHE_TEST_REQUIRE_SGLANG=1``: there a missing SGLang fails.
Everywhere else this module is an explicit skip; ``test_unified_connector.py`` covers the
connector with fake SGLang objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from prerequisites import require_module

require_module(
    "sglang",
    "SGLang is installed only in the sglang-cpu nox session (nox -s sglang-cpu)",
    required_env="LMCACHE_TEST_REQUIRE_SGLANG",
)

pytestmark = pytest.mark.sglang

PAGE, CHUNK = 16, 64


def test_sglang_radix_cache_imports_our_connector() -> None:
    from sglang.srt.mem_cache.storage.lmcache import lmcache_unified_radix_cache as radix

    from lmcache.integration.sglang import lmcache_mp_metadata, unified_lmcache_mp_connector

    assert radix.UnifiedLMCacheMPConnector is unified_lmcache_mp_connector.UnifiedLMCacheMPConnector
    assert radix.LMCacheExternalFlow is lmcache_mp_metadata.LMCacheExternalFlow
    assert radix.LMCachePendingStore is lmcache_mp_metadata.LMCachePendingStore


def _pool(seed: int) -> Any:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(
        size=16 * PAGE, page_size=PAGE, dtype=torch.bfloat16, head_num=2, head_dim=8,
        layer_num=2, device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for buffer in [*pool.k_buffer, *pool.v_buffer]:
        buffer.copy_(torch.randn(buffer.shape, generator=gen).to(buffer.dtype))
    return pool


class _Allocator:
    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def get_kvcache(self) -> Any:
        return self._pool


def _connector(config: Path, pool: Any) -> Any:
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    from lmcache.integration.sglang.unified_lmcache_mp_connector import (
        UnifiedLMCacheMPConnector,
    )

    return UnifiedLMCacheMPConnector(
        config_file=str(config), model_config=type("M", (), {"model_path": "m"})(),
        tp_size=1, tp_rank=0, tp_group=None, page_size=PAGE,
        token_to_kv_pool_allocator=_Allocator(pool), req_to_token_pool=None,
        tree_components=(ComponentType.FULL,), mamba_component=None,
        sliding_window_size=None,
    )  # fmt: skip


def test_real_sglang_pool_round_trip(small_server: Any, tmp_path: Path) -> None:
    url = small_server("--chunk-size", str(CHUNK))
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    config = tmp_path / "cfg.yaml"
    config.write_text(f"mp_host: {host}\nmp_port: {port}\n")
    src_pool, dst_pool = _pool(1), _pool(2)
    writer, reader = _connector(config, src_pool), _connector(config, dst_pool)
    try:
        ids = list(range(1, 2 * CHUNK + 1))
        source = torch.arange(PAGE, PAGE + 2 * CHUNK)
        op = writer.submit_store("w", ids, [source], device_indices_start=0, cache_salt="")
        assert op is not None and writer.complete_store(op)
        lookup = reader.submit_lookup("r", ids, local_hit_tokens=0, cache_salt="")
        hit = None
        while hit is None:
            hit = reader.poll_lookup(lookup)
        assert hit == 2 * CHUNK
        target = torch.arange(8 * PAGE, 8 * PAGE + 2 * CHUNK)
        load = reader.submit_load(lookup, [target], local_hit_tokens=0)
        assert reader.prepare_load_on_stream(load, None) and reader.complete_load(load)
        for src, dst in zip(
            [*src_pool.k_buffer, *src_pool.v_buffer],
            [*dst_pool.k_buffer, *dst_pool.v_buffer],
            strict=True,
        ):
            assert torch.equal(dst[target], src[source])
    finally:
        writer.close()
        reader.close()
