"""The worker process of the server round trip (``python -m lmcache.testing._round_trip_worker``).

Started with the backend under test selected (``LMCACHE_DEVICE_BACKEND``), exactly like an
engine's worker.  Two ``KVCacheWorker``s with their own paged KV caches on the backend's
device take turns in one transfer mode: the first stores a request's scattered blocks
(written on the device just before, behind slow work on an asynchronous device, so the
server's copy must follow the worker's event), the second looks the prefix up and
retrieves it into other blocks.  Prints one JSON line of what it observed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

LAYERS = 2
BLOCK_SIZE = 16
KV_HEADS = 4
HEAD_SIZE = 32
DTYPE = torch.bfloat16


def _kv_caches(blocks: int, device: str, shared: bool, count: int) -> list[torch.Tensor]:
    from lmcache.testing.devices import shareable_zeros

    shape = (2, blocks, BLOCK_SIZE, KV_HEADS, HEAD_SIZE)  # [K|V, blocks, slots, heads, size]
    if shared:
        return [shareable_zeros(shape, DTYPE, device) for _ in range(count)]
    return [torch.zeros(shape, dtype=DTYPE, device=device) for _ in range(count)]


def _round_trip(args: argparse.Namespace, spec: Any, device: str) -> dict[str, Any]:
    from lmcache.testing.devices import delay_current_stream, pattern, release
    from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

    n_blocks = -(-args.tokens // BLOCK_SIZE)
    blocks = 2 * n_blocks + 2
    # Host memory is mapped by the server in LMCache-driven mode: it must be shared.
    shared = device == "cpu" and args.mode == "lmcache_driven"
    src = _kv_caches(blocks, device, shared, LAYERS)
    dst = _kv_caches(blocks, device, shared, LAYERS)
    src_ids = list(range(1, 2 * n_blocks, 2))  # scattered
    dst_ids = list(range(blocks - 1, blocks - 1 - n_blocks, -1))  # elsewhere, reversed
    tokens = [(7 * i + 11) % 32000 for i in range(args.tokens)]
    workers: list[KVCacheWorker] = []
    try:
        model = f"lmcache-testing-{spec.backend_name}-{args.mode}"
        writer = KVCacheWorker(
            src, model_name=model, server_url=args.url, mode=args.mode, heartbeat_interval=0
        )
        workers.append(writer)
        reader = KVCacheWorker(
            dst, model_name=model, server_url=args.url, mode=args.mode, heartbeat_interval=0
        )
        workers.append(reader)
        delay_current_stream(spec, device)  # the KV lands late on an asynchronous device
        for layer, kv in enumerate(src):
            kv.copy_(pattern(tuple(kv.shape), DTYPE, device, seed=layer))
        stored = writer.store(tokens, src_ids)
        hit = reader.lookup(tokens)
        retrieved = reader.retrieve(tokens, dst_ids)
        others = [i for i in range(blocks) if i not in dst_ids]
        return {
            "modes": [writer.mode.value, reader.mode.value],
            "stored": stored,
            "hit": hit,
            "retrieved": retrieved,
            "bit_exact": all(
                torch.equal(s[:, src_ids].cpu(), d[:, dst_ids].cpu()) for s, d in zip(src, dst)
            ),
            "others_untouched": all(not d[:, others].cpu().any() for d in dst),
            "unseen_prompt_hit": reader.lookup([t + 1 for t in tokens]),
        }
    finally:
        for worker in workers:
            worker.close()
        release(src + dst)


def main() -> int:
    from lmcache.testing.devices import torch_device_of
    from lmcache.v1.platform.registry import current_device_spec

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", choices=["engine_driven", "lmcache_driven"], required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--tokens", type=int, default=300)
    args = parser.parse_args()
    spec = current_device_spec()
    if spec.backend_name != args.backend:
        raise SystemExit(f"selected backend is {spec.backend_name!r}, not {args.backend!r}")
    report = _round_trip(args, spec, torch_device_of(spec))
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
