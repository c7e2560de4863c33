"""The ``LMCD`` object format: XXH3-64 sums (version 2), version-1 CRC-32 objects still read,
corruption under either algorithm is a miss, and the CRC-32 fallback without ``xxhash``.

Prefixes here are packed by hand from the documented layout, not with the module's helpers,
so a change to the on-disk format shows up as a failure.
"""

from __future__ import annotations

import json
import logging
import struct
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import xxhash
from conftest import expected_tensor, make_config, make_key, put
from redis_servers import RedisServer, make_redis_backend

from lmcache.utils import CacheEngineKey
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import (
    LocalDiskBackend,
    file_name_for,
)

V1_PREFIX = struct.Struct("<4sHHIQII")  # magic, version=1, flags=0, lens, crc32s
V2_PREFIX = struct.Struct("<4sHHIQQQ")  # magic, version=2, algorithm, lens, sums


def _header(key: CacheEngineKey) -> bytes:
    value = {
        "key": key.to_string(),
        "shapes": [list(expected_tensor(0).shape)],
        "dtypes": ["half"],
        "fmt": 1,  # MemoryFormat.KV_2LTD
        "used_size": None,
    }
    return json.dumps(value).encode("utf-8")


def _v1_object(key: CacheEngineKey, value: int) -> bytes:
    header = _header(key)
    payload = expected_tensor(value).numpy().tobytes()
    prefix = V1_PREFIX.pack(
        b"LMCD", 1, 0, len(header), len(payload), zlib.crc32(payload), zlib.crc32(header)
    )
    return prefix + header + payload


def _disk(path: Path) -> tuple[LocalDiskBackend, LocalCPUBackend]:
    config = make_config(local_disk=f"file://{path}", max_local_disk_size="1MiB")
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    return LocalDiskBackend(config, cpu), cpu


def _read(disk: LocalDiskBackend, key: CacheEngineKey) -> torch.Tensor | None:
    obj = disk.get_blocking(key)
    if obj is None:
        return None
    tensor = obj.tensor.clone()
    obj.ref_count_down()
    return tensor


def test_header_fields_are_what_the_module_writes() -> None:
    from lmcache.utils import dtype_to_str
    from lmcache.v1.memory_management import MemoryFormat

    assert dtype_to_str(torch.half) == "half"
    assert MemoryFormat(1) == MemoryFormat.KV_2LTD


def test_new_objects_are_version_2_with_xxh3_sums(tmp_path: Path) -> None:
    disk, cpu = _disk(tmp_path)
    put(disk, make_key(1), 1)
    data = (tmp_path / file_name_for(make_key(1))).read_bytes()
    magic, version, algorithm, header_len, payload_len, payload_sum, header_sum = (
        V2_PREFIX.unpack_from(data)
    )
    assert (magic, version, algorithm) == (b"LMCD", 2, 2)
    header = data[V2_PREFIX.size : V2_PREFIX.size + header_len]
    payload = data[V2_PREFIX.size + header_len :]
    assert len(payload) == payload_len == expected_tensor(1).numel() * 2
    assert header_sum == xxhash.xxh3_64_intdigest(header)
    assert payload_sum == xxhash.xxh3_64_intdigest(payload)
    assert payload == expected_tensor(1).numpy().tobytes()
    disk.close()
    cpu.close()


def test_version_1_crc32_file_is_still_read(tmp_path: Path) -> None:
    (tmp_path / file_name_for(make_key(7))).write_bytes(_v1_object(make_key(7), 7))
    disk, cpu = _disk(tmp_path)  # indexed at start-up from the directory
    assert disk.contains(make_key(7))
    got = _read(disk, make_key(7))
    assert got is not None and torch.equal(got, expected_tensor(7))
    assert (tmp_path / file_name_for(make_key(7))).exists()
    # Old and new objects live side by side.
    put(disk, make_key(8), 8)
    got = _read(disk, make_key(8))
    assert got is not None and torch.equal(got, expected_tensor(8))
    disk.close()
    cpu.close()


def test_corrupt_version_1_file_is_a_miss_and_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = bytearray(_v1_object(make_key(7), 7))
    data[-3] ^= 0x01
    path = tmp_path / file_name_for(make_key(7))
    path.write_bytes(bytes(data))
    disk, cpu = _disk(tmp_path)
    with caplog.at_level(logging.WARNING, logger="lmcache"):
        assert disk.get_blocking(make_key(7)) is None
    assert "payload checksum mismatch" in caplog.text
    assert not path.exists() and not disk.contains(make_key(7))
    assert cpu.get_memory_allocator().used_bytes == 0
    disk.close()
    cpu.close()


@pytest.mark.parametrize("damage", ["payload_bit", "payload_sum", "algorithm"])
def test_corrupt_xxh3_object_is_a_miss_and_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    disk, cpu = _disk(tmp_path)
    put(disk, make_key(1), 1)
    put(disk, make_key(2), 2)
    path = tmp_path / file_name_for(make_key(1))
    data = bytearray(path.read_bytes())
    assert V2_PREFIX.unpack_from(data)[2] == 2  # XXH3-64
    if damage == "payload_bit":
        data[-10] ^= 0x01  # one bit; header and length still valid
    elif damage == "payload_sum":
        data[24] ^= 0x80  # inside payload_sum u64 (bytes 20..27)
    else:
        struct.pack_into("<H", data, 6, 1)  # claims CRC-32: the sums no longer match
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="lmcache"):
        assert disk.get_blocking(make_key(1)) is None
    assert "corrupt cache file" in caplog.text
    assert not path.exists() and not disk.contains(make_key(1))
    got = _read(disk, make_key(2))
    assert got is not None and torch.equal(got, expected_tensor(2))
    assert cpu.get_memory_allocator().used_bytes == 0
    disk.close()
    cpu.close()


FALLBACK = """
    import json, logging, struct, sys
    sys.modules["xxhash"] = None  # import xxhash -> ImportError
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("lmcache").addHandler(handler)
    logging.getLogger("lmcache").setLevel(logging.DEBUG)
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_management import TensorMemoryObj
    from lmcache.v1.storage_backend import local_disk_backend as ldb

    path = {path!r}
    disk = ldb.LocalDiskBackend(LMCacheEngineConfig.from_defaults(
        local_disk=path, max_local_disk_size="1MiB"))
    key = CacheEngineKey("fallback", 1, 0, 1, torch.half)
    data = torch.arange(2048, dtype=torch.float32).half()
    obj = TensorMemoryObj.from_tensor(data)
    for f in disk.batched_submit_put_task([key], [obj]) or []:
        f.result()
    raw = open(disk._index[key].path, "rb").read()
    got = disk.get_blocking(key)
    xxh3_key = CacheEngineKey("xxh3", 1, 0, 1, torch.half)
    print(json.dumps({{
        "prefix": list(struct.unpack_from("<4sHH", raw)[1:]),
        "roundtrip": got is not None and torch.equal(got.tensor, data),
        "xxh3_object_read": disk.get_blocking(xxh3_key) is not None,
        "xxh3_file_left": any(p.endswith(ldb.file_name_for(xxh3_key)) for p in
            __import__("os").listdir(path)),
        "debug_lines": [r.getMessage() for r in records
            if r.levelno == logging.DEBUG and "xxhash" in r.getMessage()],
    }}))
"""


def test_without_xxhash_writes_crc32_and_logs_once(
    tmp_path: Path, run_python: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    # An XXH3 object written by a process with xxhash: unverifiable without it.
    disk, cpu = _disk(tmp_path)
    xxh3_key = CacheEngineKey("xxh3", 1, 0, 1, torch.half)
    put(disk, xxh3_key, 3)
    disk.close()
    cpu.close()
    proc = run_python(FALLBACK.format(path=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["prefix"] == [2, 1]  # version 2, CRC-32
    assert result["roundtrip"] is True
    assert result["xxh3_object_read"] is False
    assert result["xxh3_file_left"] is False
    assert len(result["debug_lines"]) == 1


@pytest.mark.redis
def test_redis_reads_a_version_1_value(redis_server: RedisServer) -> None:
    import redis

    cpu = LocalCPUBackend(make_config(local_cpu=False))
    tier = make_redis_backend(redis_server.url, cpu)
    try:
        raw = redis.Redis(host="127.0.0.1", port=redis_server.port)
        raw.set(tier.redis_key(make_key(5)), _v1_object(make_key(5), 5))
        obj = tier.get_blocking(make_key(5))
        assert obj is not None and torch.equal(obj.tensor, expected_tensor(5))
        obj.ref_count_down()
    finally:
        tier.close()
        cpu.close()
