"""Local tiers for ``lmcache bench storage``: prefix lookup, CPU (L1) and disk (L2).

Registered in :data:`lmcache.bench.storage.BACKENDS` as ``cpu``, ``disk`` and ``local``
(both, plus the lookup).  Each number is measured next to its bound in the same run:
  * lookup: ``batched_contains`` over ``--num-keys`` stored keys vs a bare dict prefix
    loop over the same keys (keys/s);
  * cpu: put (allocate + copy in + store) and get (get + copy out) of whole chunks vs one
    torch copy of the same bytes (the memcpy bound);
  * disk: put (checksummed, fsynced, renamed files on the tier's thread pool) and
    ``batched_get_blocking`` (read + checksum into L1 memory) vs writing/reading the same
    bytes as plain files, one per chunk, with the same fsync.  Reads hit the page cache
    on both sides.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from lmcache.bench._output import Bar
from lmcache.bench._storage_rows import DTYPES, Row, chunk_shape
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory.allocator import HostMemoryAllocator
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

QUICK_NUM_KEYS = 20_000
_PUT_BATCH = 10_000  # keys stored per call while filling the lookup tier


class Benchmark(NamedTuple):
    """One ``--backend``: the measurement, and how many progress steps it takes."""

    run: Callable[[argparse.Namespace, Bar], tuple[list[Any], dict[str, Any]]]
    steps: Callable[[argparse.Namespace], int]


def passes(args: argparse.Namespace) -> int:
    """Warm-up plus timed passes of one measurement (one progress step each)."""
    return int(args.warmup + args.repeats)


def _median_time(
    args: argparse.Namespace,
    bar: Bar,
    fn: Callable[[], Any],
    before: Callable[[], Any] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median time of ``args.repeats`` passes after ``args.warmup`` untimed ones."""
    times = []
    for i in range(passes(args)):
        if before is not None:
            before()
        start = clock()
        fn()
        if i >= args.warmup:
            times.append(clock() - start)
        bar.update(1)
    return statistics.median(times)


def _keys(n: int, dtype: torch.dtype) -> list[CacheEngineKey]:
    base = uuid.uuid4().int >> 64
    return [CacheEngineKey("bench/model", 1, 0, base + i, dtype) for i in range(n)]


def _shape_and_dtype(args: argparse.Namespace) -> tuple[torch.Size, torch.dtype]:
    return chunk_shape(args), DTYPES[args.dtype]


def _tier_size(nbytes: int) -> str:
    return f"{(2 * nbytes + (64 << 20)) >> 20}MiB"


def _lookup_keys(args: argparse.Namespace) -> int:
    return QUICK_NUM_KEYS if args.quick else int(args.num_keys)


def _lookup_steps(args: argparse.Namespace) -> int:
    return -(-_lookup_keys(args) // _PUT_BATCH) + 4 * passes(args)


def bench_lookup(args: argparse.Namespace, bar: Bar) -> dict[str, Any]:
    """Prefix lookup of ``num_keys`` stored keys through the CPU tier vs a dict loop."""
    bar.set_description_str("bench storage lookup")
    n = _lookup_keys(args)
    keys = _keys(n, torch.half)
    allocator = HostMemoryAllocator(n * 64 + (1 << 20), min_block_size=64)
    config = LMCacheEngineConfig.from_defaults(max_local_cpu_size="1MiB")
    tier = LocalCPUBackend(config, memory_allocator=allocator)
    for start in range(0, n, _PUT_BATCH):
        batch = keys[start : start + _PUT_BATCH]
        objs = allocator.batched_allocate(torch.Size([64]), torch.uint8, len(batch))
        assert objs is not None
        tier.batched_submit_put_task(batch, list(objs))
        for obj in objs:
            obj.ref_count_down()
        bar.update(1)
    hits = tier.batched_contains(keys)
    plain = dict.fromkeys(keys)

    def tier_prefix() -> None:
        tier.batched_contains(keys)

    def dict_prefix() -> None:
        for key in keys:
            if key not in plain:
                break

    # CPU time as well as wall time: on a shared machine the wall clock mostly measures
    # how much of a core this process got.
    cpu = time.process_time
    result = {
        "keys": n,
        "hits": hits,
        "round_trips": 0,
        "keys_per_s": n / _median_time(args, bar, tier_prefix),
        "dict_keys_per_s": n / _median_time(args, bar, dict_prefix),
        "keys_per_cpu_s": n / _median_time(args, bar, tier_prefix, clock=cpu),
        "dict_keys_per_cpu_s": n / _median_time(args, bar, dict_prefix, clock=cpu),
    }
    tier.close()
    return result


def bench_cpu_rows(args: argparse.Namespace, bar: Bar) -> list[Any]:
    bar.set_description_str("bench storage cpu")
    shape, dtype = _shape_and_dtype(args)
    src = torch.randn(args.chunks, *shape).to(dtype)
    dst = torch.empty_like(src)
    nbytes = src.numel() * src.element_size()
    tier = LocalCPUBackend(LMCacheEngineConfig.from_defaults(max_local_cpu_size=_tier_size(nbytes)))
    keys = _keys(args.chunks, dtype)

    def put_all() -> None:
        for i, key in enumerate(keys):
            obj = tier.allocate(shape, dtype)
            assert obj is not None and obj.tensor is not None
            obj.tensor.copy_(src[i])
            tier.batched_submit_put_task([key], [obj])
            obj.ref_count_down()

    def get_all() -> None:
        for i, obj in enumerate(tier.batched_get_blocking(keys)):
            assert obj is not None and obj.tensor is not None
            dst[i].copy_(obj.tensor)
            obj.ref_count_down()

    t_put = _median_time(args, bar, put_all, before=lambda: tier.batched_remove(keys))
    t_get = _median_time(args, bar, get_all)
    if not torch.equal(dst, src):
        raise RuntimeError("cpu tier returned different bytes")
    t_memcpy = _median_time(args, bar, lambda: dst.copy_(src))
    tier.close()
    mib, gb = nbytes / args.chunks / (1 << 20), nbytes / 1e9
    return [
        Row("cpu", "put", mib, args.chunks, gb / t_put, gb / t_memcpy),
        Row("cpu", "get", mib, args.chunks, gb / t_get, gb / t_memcpy),
    ]


def bench_disk_rows(args: argparse.Namespace, bar: Bar) -> list[Any]:
    bar.set_description_str("bench storage disk")
    shape, dtype = _shape_and_dtype(args)
    workdir = tempfile.mkdtemp(prefix="lmc-bench-disk-", dir=getattr(args, "dir", None))
    tier_dir, plain_dir = os.path.join(workdir, "tier"), os.path.join(workdir, "plain")
    os.makedirs(plain_dir)
    chunk_bytes = shape.numel() * dtype.itemsize
    size = _tier_size(chunk_bytes * args.chunks)
    cpu = LocalCPUBackend(
        LMCacheEngineConfig.from_defaults(max_local_cpu_size=size, local_cpu=False)
    )
    disk = LocalDiskBackend(
        LMCacheEngineConfig.from_defaults(local_disk=tier_dir, max_local_disk_size=size), cpu
    )
    keys = _keys(args.chunks, dtype)
    objs: list[MemoryObj] = []
    for _ in keys:
        obj = cpu.allocate(shape, dtype)
        assert obj is not None and obj.tensor is not None
        obj.tensor.copy_(torch.randn(shape).to(dtype))
        objs.append(obj)
    payloads = [obj.byte_array for obj in objs]
    read_buf = bytearray(chunk_bytes)

    def put_all() -> None:
        for future in disk.batched_submit_put_task(keys, objs) or []:
            future.result()

    def get_all() -> None:
        for obj in disk.batched_get_blocking(keys):
            assert obj is not None
            obj.ref_count_down()

    def clear_plain() -> None:
        for name in os.listdir(plain_dir):
            os.unlink(os.path.join(plain_dir, name))

    def plain_write() -> None:
        for i, payload in enumerate(payloads):
            with open(os.path.join(plain_dir, str(i)), "wb", buffering=0) as f:
                f.write(payload)
                os.fsync(f.fileno())

    def plain_read() -> None:
        for i in range(len(payloads)):
            with open(os.path.join(plain_dir, str(i)), "rb", buffering=0) as f:
                f.readinto(read_buf)

    try:
        t_put = _median_time(args, bar, put_all, before=lambda: disk.batched_remove(keys))
        t_get = _median_time(args, bar, get_all)
        t_plain_w = _median_time(args, bar, plain_write, before=clear_plain)
        t_plain_r = _median_time(args, bar, plain_read)
        check = disk.get_blocking(keys[0])
        if check is None or bytes(check.byte_array) != bytes(payloads[0]):
            raise RuntimeError("disk tier returned different bytes")
        check.ref_count_down()
    finally:
        for obj in objs:
            obj.ref_count_down()
        disk.close()
        cpu.close()
        _rmtree(workdir)
    mib, gb = chunk_bytes / (1 << 20), chunk_bytes * args.chunks / 1e9
    return [
        Row("disk", "put", mib, args.chunks, gb / t_put, gb / t_plain_w),
        Row("disk", "get", mib, args.chunks, gb / t_get, gb / t_plain_r),
    ]


def _rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def bench_cpu(args: argparse.Namespace, bar: Bar) -> tuple[list[Any], dict[str, Any]]:
    return bench_cpu_rows(args, bar), bench_lookup(args, bar)


def bench_disk(args: argparse.Namespace, bar: Bar) -> tuple[list[Any], dict[str, Any]]:
    return bench_disk_rows(args, bar), bench_lookup(args, bar)


def bench_local(args: argparse.Namespace, bar: Bar) -> tuple[list[Any], dict[str, Any]]:
    """Lookup, CPU and disk side by side in one run."""
    return bench_cpu_rows(args, bar) + bench_disk_rows(args, bar), bench_lookup(args, bar)


# timed measurements per tier: cpu put/get/memcpy, disk put/get/plain write/plain read
_CPU_MEASUREMENTS, _DISK_MEASUREMENTS = 3, 4

BENCHMARKS: dict[str, Benchmark] = {
    "cpu": Benchmark(bench_cpu, lambda a: _CPU_MEASUREMENTS * passes(a) + _lookup_steps(a)),
    "disk": Benchmark(bench_disk, lambda a: _DISK_MEASUREMENTS * passes(a) + _lookup_steps(a)),
    "local": Benchmark(
        bench_local,
        lambda a: (_CPU_MEASUREMENTS + _DISK_MEASUREMENTS) * passes(a) + _lookup_steps(a),
    ),
}
