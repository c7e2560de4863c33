"""One timed measurement of the server benchmark: N workers store, then retrieve, fresh
chunks through one transfer path; also the sizes of a run and the memcpy reference."""

from __future__ import annotations

import argparse
import threading
import time

import torch

from lmcache.bench._output import progress
from lmcache.v1.multiprocess.wire.curve import CurveClientKeys
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class RunProgress:
    """One bar for the whole run; requests of all worker threads advance it."""

    def __init__(self, total: int) -> None:
        self._bar = progress(total, "bench server")
        self._lock = threading.Lock()

    def step(self, label: str) -> None:
        with self._lock:
            self._bar.set_description_str(label)
            self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def _kv(args: argparse.Namespace, num_blocks: int, shm: bool) -> list[torch.Tensor]:
    from lmcache.v1.platform.cpu.shm import empty_shm_tensor

    shape = (2, num_blocks, args.block_size, args.num_heads, args.head_size)
    dtype = DTYPES[args.dtype]
    layers = []
    for _ in range(args.num_layers):
        tensor = empty_shm_tensor(shape, dtype) if shm else torch.empty(shape, dtype=dtype)
        tensor.copy_(torch.randn(shape).to(dtype))
        layers.append(tensor)
    return layers


def memcpy_gbps(nbytes: int, repeats: int = 5) -> float:
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def parallel_memcpy_gbps(nbytes: int, threads: int, repeats: int = 3) -> float:
    """Aggregate GB/s of ``threads`` threads each copying ``nbytes`` at once: the memory
    bandwidth bound for that many workers (torch copies release the GIL)."""
    if threads <= 1:
        return memcpy_gbps(nbytes)
    pairs = [torch.randint(0, 255, (nbytes,), dtype=torch.uint8) for _ in range(threads)]
    targets = [torch.empty_like(src) for src in pairs]
    for dst, src in zip(targets, pairs):
        dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        barrier = threading.Barrier(threads + 1)

        workers = [
            threading.Thread(target=_copy_after, args=(barrier, dst, src))
            for dst, src in zip(targets, pairs)
        ]
        for t in workers:
            t.start()
        start = time.perf_counter()
        barrier.wait()
        for t in workers:
            t.join()
        best = min(best, time.perf_counter() - start)
    return threads * nbytes / best / 1e9


def _copy_after(barrier: threading.Barrier, dst: torch.Tensor, src: torch.Tensor) -> None:
    barrier.wait()
    dst.copy_(src)


def measure(
    args: argparse.Namespace, url: str, mode: str, sub: str | None, workers: int,
    progress: RunProgress, label: str, curve: CurveClientKeys | None = None,
) -> tuple[float, float]:  # fmt: skip
    blocks_per_request = args.chunks * args.chunk_size // args.block_size
    shm = mode == "lmcache_driven"
    caches = [_kv(args, 2 * blocks_per_request, shm) for _ in range(workers)]
    model = f"bench-{mode}-{sub}-{workers}-{time.monotonic_ns()}"
    clients = [
        KVCacheWorker(
            kv,
            model_name=model,
            server_url=url,
            mode=mode,
            sub_path=sub,
            timeout=120,
            curve=curve,
        )
        for kv in caches
    ]
    tokens_per_request = args.chunks * args.chunk_size
    store_ids = list(range(blocks_per_request))
    load_ids = list(range(blocks_per_request, 2 * blocks_per_request))
    barrier = threading.Barrier(workers + 1)
    failures: list[BaseException] = []

    def tokens(w: int, i: int) -> list[int]:
        base = (w * 1000 + i + 1) * 10_000_000
        return list(range(base, base + tokens_per_request))

    def run(w: int, phase: str) -> None:
        try:
            barrier.wait()
            for i in range(args.iters + 1):  # request 0 warms up (not timed)
                if phase == "store":
                    ok = clients[w].store(tokens(w, i), store_ids)
                else:
                    ok = clients[w].retrieve(tokens(w, i), load_ids)
                if not ok:
                    raise RuntimeError(f"{phase} failed")
                if i == 0:
                    barrier.wait()
                progress.step(f"{label} x{workers} {phase}")
            barrier.wait()
        except BaseException as exc:
            failures.append(exc)
            barrier.abort()

    results: list[float] = []
    layout = clients[0].context.layout if clients[0].context is not None else None
    assert layout is not None
    bytes_per_token = layout.bytes_per_token()
    start = time.perf_counter()
    try:
        for phase in ("store", "retrieve"):
            threads = [threading.Thread(target=run, args=(w, phase)) for w in range(workers)]
            for t in threads:
                t.start()
            try:
                barrier.wait()  # start
                barrier.wait()  # warm-up done
                start = time.perf_counter()
                barrier.wait()  # all timed requests done
            except threading.BrokenBarrierError:
                pass  # a worker failed and aborted the barrier: report its error below
            elapsed = time.perf_counter() - start
            for t in threads:
                t.join()
            if failures:
                raise failures[0]
            nbytes = workers * args.iters * tokens_per_request * bytes_per_token
            results.append(nbytes / elapsed / 1e9)
    finally:
        for client in clients:
            client.close()
    return results[0], results[1]


def run_sizes(args: argparse.Namespace, workers: int, rounds: int = 1) -> tuple[int, int, float]:
    """(chunk bytes, request bytes, L1 GiB holding every request of the run)."""
    chunk_bytes = 2 * args.num_layers * args.chunk_size * args.num_heads * args.head_size
    chunk_bytes *= DTYPES[args.dtype].itemsize
    request_bytes = chunk_bytes * args.chunks
    footprint = request_bytes * (args.iters + 1) * workers * rounds
    return chunk_bytes, request_bytes, max(0.0625, 1.25 * footprint / 1024**3)
