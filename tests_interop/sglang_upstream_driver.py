"""Runs INSIDE an environment with SGLang 0.5.23 (CPU, e2e/sglang/install.py) and the
published ``lmcache==0.5.6``: **upstream's** ``UnifiedLMCacheMPConnector`` — the class
SGLang's ``--enable-lmcache`` builds — on SGLang's real CPU ``MHATokenToKVPool``, against
a cache server on ``--port``.

A writer connector stores two chunks of a seeded pool; a reader connector (a second
instance, its own pool) looks them up and loads them into other pages.  The writer's
planes are saved to ``--workdir``/planes.pt (for the caller to load them with another
connector).  Prints one ``INTEROP-RESULT`` JSON line.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PAGE, CHUNK = 16, 64
TOKENS = list(range(1, 2 * CHUNK + 1))
SOURCE_FIRST_SLOT = PAGE  # pages 1..8 of the writer
TARGET_FIRST_SLOT = 8 * PAGE  # pages 8..15 of the reader


def _pool(seed: int) -> Any:
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(
        size=16 * PAGE, page_size=PAGE, dtype=torch.bfloat16, head_num=2, head_dim=8,
        layer_num=2, device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for plane in [*pool.k_buffer, *pool.v_buffer]:
        plane.copy_(torch.randn(plane.shape, generator=gen).to(plane.dtype))
    return pool


def _connector(config: Path, pool: Any) -> Any:
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    from lmcache.integration.sglang.unified_lmcache_mp_connector import (
        UnifiedLMCacheMPConnector,
    )

    class Allocator:
        def get_kvcache(self) -> Any:
            return pool

    model = type("ModelConfig", (), {
        "model_path": "interop-model", "attention_arch": AttentionArch.MHA,
        "hf_config": type("HF", (), {"architectures": ["LlamaForCausalLM"],
                                     "model_type": "llama"})(),
    })()  # fmt: skip
    return UnifiedLMCacheMPConnector(
        config_file=str(config), model_config=model, tp_size=1, tp_rank=0, tp_group=None,
        page_size=PAGE, token_to_kv_pool_allocator=Allocator(), req_to_token_pool=None,
        tree_components=(ComponentType.FULL,), mamba_component=None,
        sliding_window_size=None,
    )  # fmt: skip


def _wait(operation: Any) -> None:
    deadline = time.monotonic() + 30
    while not operation.query():
        if time.monotonic() > deadline:
            raise TimeoutError("operation did not finish in 30 s")
        time.sleep(0.01)


def run(port: int, workdir: Path) -> dict[str, Any]:
    import torch

    import lmcache

    config = workdir / "cfg.yaml"
    config.write_text(f"mp_host: 127.0.0.1\nmp_port: {port}\n")
    src_pool, dst_pool = _pool(1), _pool(2)
    source = torch.arange(SOURCE_FIRST_SLOT, SOURCE_FIRST_SLOT + 2 * CHUNK)
    target = torch.arange(TARGET_FIRST_SLOT, TARGET_FIRST_SLOT + 2 * CHUNK)
    writer, reader = _connector(config, src_pool), _connector(config, dst_pool)
    try:
        store = writer.submit_store("w", TOKENS, [source], device_indices_start=0, cache_salt="")
        _wait(store)
        stored = bool(writer.complete_store(store))
        writer.finish_request("w")
        lookup = reader.submit_lookup("r", TOKENS, local_hit_tokens=0, cache_salt="")
        hit = None
        while hit is None:
            hit = reader.poll_lookup(lookup)
            time.sleep(0.01)
        load = reader.submit_load(lookup, [target], local_hit_tokens=0)
        prepared = bool(reader.prepare_load_on_stream(load, None))
        _wait(load)
        loaded = bool(reader.complete_load(load))
        reader.finish_request("r")
    finally:
        writer.close()
        reader.close()
    planes = [*src_pool.k_buffer, *src_pool.v_buffer]
    loaded_planes = [*dst_pool.k_buffer, *dst_pool.v_buffer]
    torch.save([p[source].clone() for p in planes], workdir / "planes.pt")
    return {
        "lmcache_file": lmcache.__file__,
        "lmcache_version": importlib.metadata.version("lmcache"),
        "stored": stored,
        "hit": hit,
        "prepared": prepared,
        "loaded": loaded,
        "bit_exact": all(
            torch.equal(d[target], s[source]) for s, d in zip(planes, loaded_planes, strict=True)
        ),
        "tokens": TOKENS,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args()
    try:
        result = run(args.port, args.workdir)
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    sys.stdout.write("INTEROP-RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
