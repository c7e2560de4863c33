"""``lmcache demo``: store and retrieve real KV tensors through an MP cache server.

Connects to ``--url`` (default tcp://127.0.0.1:5555); with ``--start-server`` it first
launches ``lmcache server`` on the embedded defaults (on a free port unless ``--url`` is
given) and stops it afterwards.  For each transfer path the server allows, two workers
with their own paged KV caches take turns: one stores a request's blocks, the other looks
the prefix up and retrieves it into different blocks, and the demo checks the bytes match
exactly.  Every check is printed; the exit status is 0 only if all of them passed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

import torch

from lmcache.v1.multiprocess.client import (
    DEFAULT_URL,
    MPClient,
    ServerError,
    ServerUnavailableError,
    free_url,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="Store and retrieve KV tensors through an MP cache server.",
        description=__doc__,
    )
    parser.add_argument("--url", default=None, help=f"server URL (default {DEFAULT_URL})")
    parser.add_argument(
        "--start-server", action="store_true", help="launch `lmcache server` for the demo"
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.set_defaults(func=run)


def _launch(url: str) -> subprocess.Popen[bytes]:
    port = url.rsplit(":", 1)[1]
    cmd = [sys.executable, "-m", "lmcache.cli.main", "server", "--port", port]
    env = dict(os.environ, LMCACHE_LOG_LEVEL="WARNING")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            MPClient(url, timeout=2, connect_timeout=0.5).close()
            return
        except ServerUnavailableError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError("lmcache server exited during startup") from None
            if proc is None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _paged_kv(layers: int, blocks: int, shm: bool, fill: bool) -> list[torch.Tensor]:
    from lmcache.v1.platform.cpu.shm import empty_shm_tensor

    shape = (2, blocks, 16, 8, 64)  # [K|V, blocks, block size, KV heads, head size]
    kv = []
    for _ in range(layers):
        t = (
            empty_shm_tensor(shape, torch.bfloat16)
            if shm
            else torch.zeros(shape, dtype=torch.bfloat16)
        )
        if fill:
            t.copy_(torch.randn(shape).to(torch.bfloat16))
        kv.append(t)
    return kv


def _release(kv: list[torch.Tensor]) -> None:
    from lmcache.v1.platform.cpu.shm import shm_segment_of, unlink_segment

    for t in kv:
        name = shm_segment_of(t)
        if name:
            unlink_segment(name)


def _check(label: str, ok: bool, failures: list[str]) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {label}")
    if not ok:
        failures.append(label)


def _demo_path(url: str, mode: str, args: argparse.Namespace, failures: list[str]) -> None:
    from lmcache.v1.multiprocess.worker import KVCacheWorker

    shm = mode == "lmcache_driven"
    blocks = 2 * (args.tokens // 16 + 1)
    src = _paged_kv(args.layers, blocks, shm, fill=True)
    dst = _paged_kv(args.layers, blocks, shm, fill=False)
    model = f"demo-model-{mode}"
    try:
        writer = KVCacheWorker(src, model_name=model, server_url=url, mode=mode)
    except ServerError as exc:
        print(f"{mode}: refused by the server ({exc.code}); skipped")
        _release(src + dst)
        return
    reader = KVCacheWorker(dst, model_name=model, server_url=url, mode=mode)
    path = f"{mode}" + (f", sub-path {writer.sub_path}" if writer.sub_path else "")
    print(f"{path}:")
    try:
        tokens = torch.randint(0, 32000, (args.tokens,)).tolist()
        n_blocks = -(-args.tokens // 16)
        src_ids = list(range(0, 2 * n_blocks, 2))  # scattered blocks
        dst_ids = list(range(blocks - 1, blocks - 1 - n_blocks, -1))
        nbytes = args.tokens * args.layers * 2 * 8 * 64 * 2
        start = time.perf_counter()
        _check(f"store {args.tokens} tokens ({nbytes / 1024**2:.1f} MiB)",
               writer.store(tokens, src_ids), failures)  # fmt: skip
        store_s = time.perf_counter() - start
        hit = reader.lookup(tokens)
        _check(f"lookup from another worker hits {hit}/{args.tokens} tokens",
               hit == args.tokens, failures)  # fmt: skip
        start = time.perf_counter()
        _check("retrieve into different blocks", reader.retrieve(tokens, dst_ids), failures)
        retrieve_s = time.perf_counter() - start
        exact = all(torch.equal(s[:, src_ids], d[:, dst_ids]) for s, d in zip(src, dst))
        _check("retrieved KV is bit-exact", exact, failures)
        other = torch.randint(0, 32000, (args.tokens,)).tolist()
        _check("unseen prompt misses", reader.lookup(other) == 0, failures)
        print(
            f"  store {nbytes / store_s / 1e9:.2f} GB/s, "
            f"retrieve {nbytes / retrieve_s / 1e9:.2f} GB/s"
        )
    finally:
        writer.close()
        reader.close()
        _release(src + dst)


def run(args: argparse.Namespace) -> int:
    url = args.url or (free_url() if args.start_server else DEFAULT_URL)
    proc = _launch(url) if args.start_server else None
    failures: list[str] = []
    try:
        try:
            _wait_for(url, proc)
        except ServerUnavailableError as exc:
            print(f"{exc}\nStart one with `lmcache server`, or run `lmcache demo --start-server`.")
            return 1
        with MPClient(url) as client:
            stats = client.get_stats()
        print(
            f"LMCache server at {url}: chunk size {stats.chunk_size}, L1 "
            f"{stats.l1_capacity_bytes / 1024**3:.2f} GiB, transfer mode "
            f"{stats.supported_transfer_mode}, SHM {stats.shm_name or 'off'}"
        )
        for mode in ("lmcache_driven", "engine_driven"):
            _demo_path(url, mode, args, failures)
        with MPClient(url) as client:
            stats = client.get_stats()
        print(f"server counters: stored {stats.stored_tokens} tokens, retrieved "
              f"{stats.retrieved_tokens} tokens, {stats.l1_chunks} chunks in L1")  # fmt: skip
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    print("all checks passed" if not failures else f"{len(failures)} check(s) FAILED")
    return 0 if not failures else 1
