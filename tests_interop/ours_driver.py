"""Our ``KVCacheWorker`` against a server at ``url``: register a CPU paged KV cache, store,
look up, retrieve into other blocks and compare bytes.  Runs in our environment."""

from __future__ import annotations

import time
from typing import Any

import torch

from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker
from lmcache.v1.platform.cpu.shm import empty_shm_tensor

NUM_LAYERS = 2
NUM_BLOCKS = 32
BLOCK_SIZE = 16
NUM_HEADS = 2
HEAD_SIZE = 32


def make_kv(shared: bool) -> list[torch.Tensor]:
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE)
    torch.manual_seed(1)
    layers = []
    for _ in range(NUM_LAYERS):
        tensor = (
            empty_shm_tensor(shape, torch.float16)
            if shared
            else torch.empty(shape, dtype=torch.float16)
        )
        tensor.copy_(torch.randn(shape, dtype=torch.float16))
        layers.append(tensor)
    return layers


def patterned_kv(shared: bool) -> list[torch.Tensor]:
    """The same fixed pattern as ``upstream_driver.patterned_kv`` (no RNG), so a cache
    one connector stores can be checked byte for byte by the other."""
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE)
    numel = 2 * NUM_BLOCKS * BLOCK_SIZE * NUM_HEADS * HEAD_SIZE
    layers = []
    for layer in range(NUM_LAYERS):
        values = (torch.arange(numel, dtype=torch.int64) * 7 + layer * 13) % 251 - 125
        tensor = (
            empty_shm_tensor(shape, torch.float16)
            if shared
            else torch.empty(shape, dtype=torch.float16)
        )
        tensor.copy_((values.to(torch.float16) / 8).reshape(shape))
        layers.append(tensor)
    return layers


def cross_phase(
    url: str, mode: str, phase: str, *, model: str, token_base: int, num_tokens: int = 128
) -> dict[str, Any]:
    """Our half of a cross-connector exchange (see ``upstream_driver.run_phase``)."""
    kv = patterned_kv(shared=mode == "lmcache_driven")
    expected = [t.clone() for t in kv]
    blocks = list(range(num_tokens // BLOCK_SIZE))
    tokens = list(range(token_base, token_base + num_tokens))
    result: dict[str, Any] = {"phase": phase, "mode": mode}
    if phase == "load":
        for t in kv:
            t[:, blocks] = 0
    with KVCacheWorker(
        kv, model_name=model, server_url=url, mode=mode, heartbeat_interval=0
    ) as worker:
        if phase == "store":
            result["store_ok"] = worker.store(tokens, blocks)
        else:
            result["lookup_hit_tokens"] = worker.lookup(tokens)
            result["retrieve_ok"] = worker.retrieve(tokens, blocks)
            result["bytes_equal"] = all(torch.equal(t, e) for t, e in zip(kv, expected))
    return result


def store_lookup_retrieve(
    url: str, mode: str, *, model: str, num_tokens: int = 128, **worker_kw: Any
) -> dict[str, Any]:
    kv = make_kv(shared=mode == "lmcache_driven")
    result: dict[str, Any] = {"mode": mode}
    with KVCacheWorker(
        kv, model_name=model, server_url=url, mode=mode, heartbeat_interval=0, **worker_kw
    ) as worker:
        result["server_is_upstream"] = worker.client.server_is_upstream
        result["sub_path"] = worker.sub_path
        tokens = list(range(2000, 2000 + num_tokens))
        nblk = num_tokens // BLOCK_SIZE
        src, dst = list(range(nblk)), list(range(nblk, 2 * nblk))
        snapshot = [t[:, src].clone() for t in kv]
        result["store_ok"] = worker.store(tokens, src)
        # Upstream commits a stored chunk from a stream callback after replying, so the
        # store is not read-your-writes there: poll briefly.
        deadline = time.monotonic() + 10
        while (hit := worker.lookup(tokens)) < num_tokens and time.monotonic() < deadline:
            time.sleep(0.05)
        result["lookup_hit_tokens"] = hit
        result["miss_hit_tokens"] = worker.lookup(list(range(9000, 9000 + num_tokens)))
        for t in kv:
            t[:, dst] = 0
        result["retrieve_ok"] = worker.retrieve(tokens, dst)
        result["bytes_equal"] = all(torch.equal(t[:, dst], s) for t, s in zip(kv, snapshot))
    return result
