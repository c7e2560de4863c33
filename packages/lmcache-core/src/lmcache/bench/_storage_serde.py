"""``lmcache bench storage --serde SPEC``: what each L2 serde saves and costs, side by side.

For each serde (``--serde`` repeated, or ``all``) and one run of the same chunks:

* bytes: stored bytes per chunk against the chunk's own (``stored %``, ``saved %``);
* speed: encode and decode GB/s of chunk payload on one thread, against a raw copy of
  the same bytes (memcpy) in the same run; for ``aesgcm`` also the cipher alone
  (AES-GCM over the chunk, no framing), which AES-NI should keep above 1 GB/s;
* the disk tier with the serde against the disk tier without one (put + get, page cache,
  no fsync, so the serde's share is visible), alternating so drift hits all alike;
* error statistics of the lossy serdes on the chunks read back: max and mean absolute
  error, and the mean relative error (mean |err| / mean |x|).

Chunks hold normally distributed values (``torch.randn``), not a model's KV.  ``aesgcm``
without a key in its JSON gets a random key for the run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lmcache.bench._output import Bar
from lmcache.bench._storage_rows import DTYPES, chunk_shape
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.chunk_format import allocate_for_read
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
from lmcache.v1.storage_backend.serde import (
    SerdeBackend,
    SerdeConfig,
    build_chunk_serde,
    parse_serde_config,
)
from lmcache.v1.storage_backend.serde.chunk_serde import ChunkSerde

KEY_ENV = "LMCACHE_BENCH_SERDE_KEY"
_AES = {"type": "aesgcm", "master_key_env": KEY_ENV}
SHORTHANDS: dict[str, dict[str, Any]] = {
    "fp8": {"type": "fp8"},
    "fp8-e5m2": {"type": "fp8", "fp8_dtype": "float8_e5m2"},
    "asym_k16_v8": {"type": "asym_k16_v8"},
    "aesgcm": _AES,
    "multi": {"type": "multi", "serdes": [{"type": "asym_k16_v8"}, _AES]},
}
ALL = "all"


def serde_arg(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``--serde``: a shorthand (``fp8``, ``fp8-e5m2``, ``asym_k16_v8``, ``aesgcm``,
    ``multi`` = asym_k16_v8 then aesgcm, ``all``) or a serde JSON object."""
    if text == ALL:
        return list(SHORTHANDS.items())
    if text in SHORTHANDS:
        return [(text, SHORTHANDS[text])]
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        known = ", ".join([*SHORTHANDS, ALL])
        raise argparse.ArgumentTypeError(
            f"--serde {text!r}: neither a shorthand ({known}) nor JSON"
        ) from None
    try:
        parse_serde_config(spec, "--serde")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return [(str(spec["type"]), spec)]


@dataclass
class SerdeRow:
    serde: str
    chunk_mib: float
    chunks: int
    stored_pct: float
    saved_pct: float
    encode_gbps: float
    decode_gbps: float
    copy_gbps: float
    cipher_gbps: float | None
    disk_put_gbps: float
    disk_get_gbps: float
    plain_put_gbps: float
    plain_get_gbps: float
    max_abs_err: float
    mean_abs_err: float
    mean_rel_err: float

    @property
    def encode_vs_copy(self) -> float:
        return self.encode_gbps / self.copy_gbps


def _unique_labels(specs: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Labels made distinct (``fp8`` twice: ``fp8``, ``fp8#2``): each gets its own tier."""
    seen: dict[str, int] = {}
    out = []
    for label, spec in specs:
        seen[label] = seen.get(label, 0) + 1
        out.append((label if seen[label] == 1 else f"{label}#{seen[label]}", spec))
    return out


def steps(args: argparse.Namespace) -> int:
    return int(args.warmup + args.repeats) * 2


def _with_key(spec: dict[str, Any]) -> SerdeConfig:
    if KEY_ENV not in os.environ:
        os.environ[KEY_ENV] = os.urandom(32).hex()  # this process only: a bench key
    return parse_serde_config(spec, "--serde")


def _median(args: argparse.Namespace, fn: Callable[[], None]) -> float:
    samples = []
    for i in range(args.warmup + args.repeats):
        start = time.perf_counter()
        fn()
        if i >= args.warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run(args: argparse.Namespace, bar: Bar) -> tuple[list[SerdeRow], dict[str, Any]]:
    specs = _unique_labels([item for group in args.serde for item in group])
    shape, dtype = chunk_shape(args), DTYPES[args.dtype]
    chunk_bytes = shape.numel() * dtype.itemsize
    n = args.chunks
    budget = f"{(4 + 2 * len(specs)) * n * chunk_bytes + (64 << 20)}B"
    cpu = LocalCPUBackend(
        LMCacheEngineConfig.from_defaults(local_cpu=False, max_local_cpu_size=budget)
    )
    serdes = [(label, build_chunk_serde(_with_key(spec))) for label, spec in specs]
    objs = cpu.batched_allocate(shape, dtype, n, busy_loop=False)
    assert objs is not None, "bench allocator too small"
    for obj in objs:
        assert obj.tensor is not None
        obj.tensor.copy_(torch.randn(shape).to(dtype))
    try:
        with tempfile.TemporaryDirectory(prefix="lmc-bench-serde-", dir=args.dir) as tmp:
            disk = _disk_rates(args, cpu, objs, serdes, tmp, dtype, bar)
        rows = [
            _row(args, label, serde, cpu, objs, chunk_bytes, disk[label], disk[""], bar)
            for label, serde in serdes
        ]
    finally:
        for obj in objs:
            obj.ref_count_down()
        cpu.close()
    return rows, {"payload": "torch.randn", "dtype": args.dtype, "threads": 1}


def _row(
    args: argparse.Namespace,
    label: str,
    serde: ChunkSerde,
    cpu: LocalCPUBackend,
    objs: list[MemoryObj],
    chunk_bytes: int,
    disk: tuple[float, float],
    plain: tuple[float, float],
    bar: Bar,
) -> SerdeRow:
    keys = [
        CacheEngineKey("bench/model", 1, 0, i, objs[0].get_dtypes()[0]) for i in range(len(objs))
    ]
    total = chunk_bytes * len(objs)
    blobs: list[bytearray] = []

    def encode() -> None:
        blobs[:] = [serde.encode(k, o) for k, o in zip(keys, objs)]

    def decode() -> None:
        for k, blob in zip(keys, blobs):
            out = serde.decode(k, blob, _standalone)
            assert out is not None

    sources = [obj.raw_tensor for obj in objs]
    # Destinations allocated once: a fresh buffer per copy would time page faults too.
    targets = [torch.empty_like(src) for src in sources if src is not None]

    def copy() -> None:
        for src, dst in zip(sources, targets):
            assert src is not None
            dst.copy_(src)

    encode_s = _median(args, encode)
    decode_s = _median(args, decode)
    copy_s = _median(args, copy)
    bar.update(1)
    cipher = _cipher_gbps(args, objs, total) if "aesgcm" in serde.spec else None
    errors = _errors(serde, keys, objs, blobs)
    stored = sum(len(b) for b in blobs) / total
    return SerdeRow(
        serde=label,
        chunk_mib=chunk_bytes / 2**20,
        chunks=len(objs),
        stored_pct=100 * stored,
        saved_pct=100 * (1 - stored),
        encode_gbps=total / encode_s / 1e9,
        decode_gbps=total / decode_s / 1e9,
        copy_gbps=total / copy_s / 1e9,
        cipher_gbps=cipher,
        disk_put_gbps=disk[0],
        disk_get_gbps=disk[1],
        plain_put_gbps=plain[0],
        plain_get_gbps=plain[1],
        **errors,
    )


def _standalone(shapes: Any, dtypes: Any, fmt: Any) -> MemoryObj | None:
    return allocate_for_read(None, shapes, dtypes, fmt)


def _cipher_gbps(args: argparse.Namespace, objs: list[MemoryObj], total: int) -> float:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    cipher = AESGCM(os.urandom(32))
    iv = os.urandom(12)  # one IV for every call is fine here: nothing is kept

    def seal() -> None:
        for obj in objs:
            cipher.encrypt(iv, obj.byte_array, None)

    return total / _median(args, seal) / 1e9


def _errors(
    serde: ChunkSerde, keys: list[CacheEngineKey], objs: list[MemoryObj], blobs: list[bytearray]
) -> dict[str, float]:
    max_abs = sum_abs = sum_x = 0.0
    count = 0
    for k, obj, blob in zip(keys, objs, blobs):
        back = serde.decode(k, blob, _standalone)
        assert back is not None and back.tensor is not None and obj.tensor is not None
        x = obj.tensor.float()
        err = (back.tensor.float() - x).abs()
        max_abs = max(max_abs, float(err.max()))
        sum_abs += float(err.sum())
        sum_x += float(x.abs().sum())
        count += x.numel()
        back.ref_count_down()
    return {
        "max_abs_err": max_abs,
        "mean_abs_err": sum_abs / max(count, 1),
        "mean_rel_err": sum_abs / sum_x if sum_x else 0.0,
    }


def _disk_rates(
    args: argparse.Namespace,
    cpu: LocalCPUBackend,
    objs: list[MemoryObj],
    serdes: list[tuple[str, ChunkSerde]],
    folder: str,
    dtype: torch.dtype,
    bar: Bar,
) -> dict[str, tuple[float, float]]:
    """(put, get) GB/s of the disk tier without a serde ("") and with each, alternating."""
    total = objs[0].get_size() * len(objs)
    size = f"{4 * total * (1 + len(serdes)) + (64 << 20)}B"
    tiers: dict[str, StorageBackendInterface] = {}
    for label in ["", *(label for label, _ in serdes)]:
        config = LMCacheEngineConfig.from_defaults(
            local_disk=os.path.join(folder, label or "plain"),
            max_local_disk_size=size,
            extra_config={"local_disk.fsync": False},
        )
        tiers[label] = LocalDiskBackend(config, cpu)
    for label, serde in serdes:
        tiers[label] = SerdeBackend(tiers[label], serde, cpu)
    times: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label in tiers}
    try:
        for i in range(args.warmup + args.repeats):
            for label, tier in tiers.items():
                put_s, get_s = _put_get(tier, objs, dtype)
                if i >= args.warmup:
                    times[label][0].append(put_s)
                    times[label][1].append(get_s)
            bar.update(1)
    finally:
        for tier in tiers.values():
            tier.close()
    return {
        label: (total / statistics.median(p) / 1e9, total / statistics.median(g) / 1e9)
        for label, (p, g) in times.items()
    }


def _put_get(
    tier: StorageBackendInterface, objs: list[MemoryObj], dtype: torch.dtype
) -> tuple[float, float]:
    base = uuid.uuid4().int >> 64
    keys = [CacheEngineKey("bench/model", 1, 0, base + i, dtype) for i in range(len(objs))]
    start = time.perf_counter()
    for future in tier.batched_submit_put_task(keys, objs) or []:
        future.result()
    wait = getattr(tier, "wait_for_puts", None)
    if callable(wait):
        wait()
    put_s = time.perf_counter() - start
    start = time.perf_counter()
    got = tier.batched_get_blocking(keys)
    get_s = time.perf_counter() - start
    assert all(obj is not None for obj in got), "bench: disk tier missed"
    for obj in got:
        if obj is not None:
            obj.ref_count_down()
    tier.batched_remove(keys)
    return put_s, get_s


def print_rows(rows: list[SerdeRow]) -> None:
    print(
        "L2 serde, one thread; GB/s (1e9 bytes/s) of chunk payload, median of repeats; "
        "copy = memcpy of the same bytes; disk = page cache, no fsync"
    )
    header = (
        f"{'serde':<12} {'stored %':>8} {'enc GB/s':>8} {'dec GB/s':>8} {'copy':>6} "
        f"{'cipher':>6} {'disk put':>8} {'plain':>6} {'disk get':>8} {'plain':>6} "
        f"{'max abs':>8} {'mean abs':>9} {'mean rel':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        cipher = f"{r.cipher_gbps:6.2f}" if r.cipher_gbps is not None else f"{'-':>6}"
        print(
            f"{r.serde:<12} {r.stored_pct:>8.1f} {r.encode_gbps:>8.2f} {r.decode_gbps:>8.2f} "
            f"{r.copy_gbps:>6.2f} {cipher} {r.disk_put_gbps:>8.2f} {r.plain_put_gbps:>6.2f} "
            f"{r.disk_get_gbps:>8.2f} {r.plain_get_gbps:>6.2f} {r.max_abs_err:>8.4f} "
            f"{r.mean_abs_err:>9.5f} {r.mean_rel_err:>9.5f}"
        )
