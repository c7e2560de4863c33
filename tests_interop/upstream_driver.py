"""Runs INSIDE the upstream venv (published ``lmcache==0.5.6``): drives upstream's MP
adapters against a cache server given by ``--url`` and prints one JSON result line.

Scenario: register a CPU paged KV cache (``[2, NB, BS, NH, HS]`` per layer), store a
prompt's blocks, look the prompt up through the scheduler adapter, retrieve into other
blocks and compare bytes.  Nothing here imports lmcache-core.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from typing import Any

NUM_LAYERS = 2
NUM_BLOCKS = 32
BLOCK_SIZE = 16
NUM_HEADS = 2
HEAD_SIZE = 32


def _parallel_strategy(adapter_mod: Any) -> Any:
    return adapter_mod.ParallelStrategy(
        mla_only=False, vllm_world_size=1, vllm_worker_id=0, tp_size=1, pp_size=1, n_servers=1
    )


def _wait(predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value is not None:
            return value
        time.sleep(0.05)
    raise TimeoutError("condition not met in time")


def run(url: str, mode: str, num_tokens: int) -> dict[str, Any]:
    import torch
    import zmq

    from lmcache.integration.vllm import vllm_multi_process_adapter as adapters

    result: dict[str, Any] = {"mode": mode}
    model = f"interop-{mode}"
    ctx = zmq.Context()
    extra = {
        "lmcache.mp.mp_transfer_mode": mode,
        "lmcache.mp.mq_timeout": 20.0,
        "lmcache.mp.heartbeat_interval": 5.0,
    }
    strategy = _parallel_strategy(adapters)
    scheduler = adapters.LMCacheMPSchedulerAdapter(
        [url], ctx, model, BLOCK_SIZE, strategy, extra_config=extra
    )
    worker = adapters.LMCacheMPWorkerAdapter(
        url, ctx, model, BLOCK_SIZE, strategy, extra_config=extra
    )
    torch.manual_seed(0)
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE)
    kv = {f"layer.{i}": torch.randn(shape, dtype=torch.float16) for i in range(NUM_LAYERS)}
    # Without vLLM installed upstream cannot ask it for the KV layout; name it (NHD).
    worker.register_kv_caches(kv, layout_hints={"kv_layout": "NHD"})
    result["transfer_context"] = type(worker.transfer_ctx).__name__
    result["engine_driven_context"] = type(
        getattr(worker.transfer_ctx, "_engine_driven_context", None)
        or getattr(worker.transfer_ctx, "context", None)
    ).__name__

    tokens = list(range(1000, 1000 + num_tokens))
    nblk = num_tokens // BLOCK_SIZE
    src_blocks = list(range(0, nblk))
    dst_blocks = list(range(nblk, 2 * nblk))
    snapshot = {name: t[:, src_blocks].clone() for name, t in kv.items()}

    store_op = adapters.LoadStoreOp(
        token_ids=tokens, block_ids=[src_blocks], start=0, end=num_tokens
    )
    event = worker.create_recorded_event()
    worker.submit_store_request("req-store", store_op, event)
    result["store_ok"] = bool(worker.store_futures["req-store"].result(timeout=30))

    scheduler.maybe_submit_lookup_request("req-lookup", tokens)
    hit = _wait(lambda: scheduler.check_lookup_result("req-lookup"), 20)
    result["lookup_hit_tokens"] = int(hit)

    for t in kv.values():
        t[:, dst_blocks] = 0
    load_op = adapters.LoadStoreOp(token_ids=tokens, block_ids=[dst_blocks], start=0, end=int(hit))
    event = worker.create_recorded_event()
    worker.submit_retrieve_request("req-lookup", load_op, event)
    retrieve_future = worker.retrieve_futures["req-lookup"][0]
    result["retrieve_ok"] = bool(retrieve_future.result(timeout=30))
    hit_blocks = int(hit) // BLOCK_SIZE
    result["bytes_equal"] = all(
        torch.equal(kv[name][:, dst_blocks[:hit_blocks]], snapshot[name][:, :hit_blocks])
        for name in kv
    )
    scheduler.end_session("req-lookup")

    miss_tokens = list(range(5000, 5000 + num_tokens))
    scheduler.maybe_submit_lookup_request("req-miss", miss_tokens)
    result["miss_hit_tokens"] = int(_wait(lambda: scheduler.check_lookup_result("req-miss"), 20))
    scheduler.end_session("req-miss")
    worker.shutdown()
    scheduler.shutdown()
    # Upstream unlinks the KV cache's SHM segments when the tensors are collected; the
    # os._exit in main would skip that.
    kv.clear()
    snapshot.clear()
    gc.collect()
    return result


def patterned_kv(layer: int) -> Any:
    """KV contents both connectors can rebuild exactly (the cross-connector test):
    a fixed float16 pattern per layer, no RNG."""
    import torch

    shape = (2, NUM_BLOCKS, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE)
    numel = 2 * NUM_BLOCKS * BLOCK_SIZE * NUM_HEADS * HEAD_SIZE
    values = (torch.arange(numel, dtype=torch.int64) * 7 + layer * 13) % 251 - 125
    return (values.to(torch.float16) / 8).reshape(shape)


def run_phase(url: str, mode: str, phase: str, model: str, token_base: int, n: int) -> Any:
    """One half of a cross-connector exchange on one server: ``store`` the patterned
    cache's first blocks, or ``load`` (lookup, retrieve into zeroed blocks, compare with
    the pattern) what the other connector stored."""
    import torch
    import zmq

    from lmcache.integration.vllm import vllm_multi_process_adapter as adapters

    extra = {"lmcache.mp.mp_transfer_mode": mode, "lmcache.mp.mq_timeout": 20.0}
    strategy = _parallel_strategy(adapters)
    ctx = zmq.Context()
    worker = adapters.LMCacheMPWorkerAdapter(
        url, ctx, model, BLOCK_SIZE, strategy, extra_config=extra
    )
    kv = {f"layer.{i}": patterned_kv(i) for i in range(NUM_LAYERS)}
    expected = {name: t.clone() for name, t in kv.items()}
    blocks = list(range(n // BLOCK_SIZE))
    if phase == "load":
        for t in kv.values():
            t[:, blocks] = 0
    worker.register_kv_caches(kv, layout_hints={"kv_layout": "NHD"})
    tokens = list(range(token_base, token_base + n))
    result: dict[str, Any] = {"phase": phase, "mode": mode}
    op = adapters.LoadStoreOp(token_ids=tokens, block_ids=[blocks], start=0, end=n)
    if phase == "store":
        worker.submit_store_request("req-x", op, worker.create_recorded_event())
        result["store_ok"] = bool(worker.store_futures["req-x"].result(timeout=30))
    else:
        scheduler = adapters.LMCacheMPSchedulerAdapter(
            [url], ctx, model, BLOCK_SIZE, strategy, extra_config=extra
        )
        scheduler.maybe_submit_lookup_request("req-x", tokens)
        hit = int(_wait(lambda: scheduler.check_lookup_result("req-x"), 20))
        result["lookup_hit_tokens"] = hit
        if hit:
            op = adapters.LoadStoreOp(token_ids=tokens, block_ids=[blocks], start=0, end=hit)
            worker.submit_retrieve_request("req-x", op, worker.create_recorded_event())
            result["retrieve_ok"] = bool(worker.retrieve_futures["req-x"][0].result(timeout=30))
        result["bytes_equal"] = all(torch.equal(kv[k], expected[k]) for k in kv)
        scheduler.end_session("req-x")
        scheduler.shutdown()
    worker.shutdown()
    kv.clear()
    gc.collect()
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", required=True, choices=["engine_driven", "lmcache_driven"])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--phase", choices=["all", "store", "load"], default="all")
    parser.add_argument("--model", default="interop-cross")
    parser.add_argument("--token-base", type=int, default=3000)
    args = parser.parse_args()
    try:
        if args.phase == "all":
            result = run(args.url, args.mode, args.tokens)
        else:
            result = run_phase(
                args.url, args.mode, args.phase, args.model, args.token_base, args.tokens
            )
    except BaseException as exc:  # report, do not hang the parent test
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    sys.stdout.write("INTEROP-RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # upstream's polling threads may linger; the result is already out


if __name__ == "__main__":
    raise SystemExit(main())
