"""Disk tier: restart, eviction, corruption and a real SIGKILL mid-write."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import expected_tensor, make_config, make_key, put

from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import (
    FILE_SUFFIX,
    MARKER_NAME,
    LocalDiskBackend,
    file_name_for,
)


def _disk(path: Path, size: str = "1MiB") -> tuple[LocalDiskBackend, LocalCPUBackend]:
    config = make_config(local_disk=f"file://{path}", max_local_disk_size=size)
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    return LocalDiskBackend(config, cpu), cpu


def test_index_is_rebuilt_on_restart(tmp_path: Path) -> None:
    disk, cpu = _disk(tmp_path)
    for i in range(5):
        put(disk, make_key(i), i)
    disk.close()
    disk2 = LocalDiskBackend(disk.config, cpu)
    assert disk2.batched_contains([make_key(i) for i in range(5)]) == 5
    obj = disk2.get_blocking(make_key(3))
    assert obj is not None and torch.equal(obj.tensor, expected_tensor(3))
    obj.ref_count_down()
    assert disk2.used_bytes == disk.used_bytes
    disk2.close()
    cpu.close()


def test_disk_is_bounded_and_respects_pins(tmp_path: Path) -> None:
    disk, cpu = _disk(tmp_path, size="64KiB")  # about 15 objects of 4 KiB + header
    put(disk, make_key(0), 0)
    assert disk.pin(make_key(0))
    for i in range(1, 60):
        put(disk, make_key(i), i)
    assert disk.used_bytes <= disk.capacity_bytes
    assert disk.contains(make_key(0)) and not disk.contains(make_key(1))
    assert disk.contains(make_key(59))
    files = [p for p in tmp_path.iterdir() if p.name.endswith(FILE_SUFFIX)]
    assert len(files) == len(disk)
    disk.close()
    cpu.close()


def test_corrupt_file_is_a_logged_miss_and_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk, cpu = _disk(tmp_path)
    put(disk, make_key(1), 1)
    put(disk, make_key(2), 2)
    path = tmp_path / file_name_for(make_key(1))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # flip a payload byte: header and length still look fine
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="lmcache"):
        assert disk.get_blocking(make_key(1)) is None
    assert "corrupt cache file" in caplog.text
    assert not path.exists() and not disk.contains(make_key(1))
    obj = disk.get_blocking(make_key(2))
    assert obj is not None and torch.equal(obj.tensor, expected_tensor(2))
    obj.ref_count_down()
    assert cpu.get_memory_allocator().used_bytes == 0
    disk.close()
    cpu.close()


def test_truncated_and_garbage_files_are_dropped_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk, cpu = _disk(tmp_path)
    for i in range(3):
        put(disk, make_key(i), i)
    disk.close()
    truncated = tmp_path / file_name_for(make_key(0))
    truncated.write_bytes(truncated.read_bytes()[:-100])
    (tmp_path / ("0" * 32 + FILE_SUFFIX)).write_bytes(b"not a cache file")
    (tmp_path / f"{file_name_for(make_key(9))}.1234abcd.tmp").write_bytes(b"partial")
    with caplog.at_level(logging.WARNING, logger="lmcache"):
        disk2 = LocalDiskBackend(disk.config, cpu)
    assert caplog.text.count("corrupt cache file") == 2
    assert disk2.batched_contains([make_key(i) for i in range(3)]) == 0
    assert disk2.batched_contains([make_key(1), make_key(2)]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [MARKER_NAME, *(file_name_for(make_key(i)) for i in (1, 2))]
    )
    disk2.close()
    cpu.close()


WRITER = textwrap.dedent(
    """
    import os, sys, torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_management import TensorMemoryObj
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

    config = LMCacheEngineConfig.from_defaults(
        local_disk=sys.argv[1], max_local_disk_size="1GB",
        extra_config={"local_disk.num_workers": 2})
    disk = LocalDiskBackend(config)
    i = 0
    in_flight = []
    while True:
        key = CacheEngineKey("crash", 1, 0, i, torch.half)
        data = torch.arange(512 * 1024, dtype=torch.float32).half() + i
        obj = TensorMemoryObj.from_tensor(data)
        for future in disk.batched_submit_put_task([key], [obj]):
            # One os.write per line: atomic, so lines from pool threads never interleave.
            future.add_done_callback(lambda f, i=i: os.write(1, f"{i}\\n".encode()))
            in_flight.append(future)
        obj.ref_count_down()
        while len(in_flight) > 2:
            in_flight.pop(0).result()
        i += 1
    """
)


def test_sigkill_mid_write_keeps_every_completed_put(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    completed: list[int] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    try:
        while len(completed) < 20 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            completed.append(int(line))
    finally:
        # Also on a test timeout: an orphaned writer would fill the disk forever.
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert len(completed) >= 20, "writer did not complete enough puts"

    disk, cpu = _disk(tmp_path, size="1GB")
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    for i in completed:
        obj = disk.get_blocking(make_key_crash(i))
        assert obj is not None, f"completed put {i} lost"
        want = torch.arange(512 * 1024, dtype=torch.float32).half() + i
        assert torch.equal(obj.tensor, want)
        obj.ref_count_down()
    for key in disk.get_keys():  # whatever else survived is complete and valid
        obj = disk.get_blocking(key)
        assert obj is not None
        want = torch.arange(512 * 1024, dtype=torch.float32).half() + key.chunk_hash
        assert torch.equal(obj.tensor, want)
        obj.ref_count_down()
    disk.close()
    cpu.close()


def make_key_crash(i: int) -> object:
    from lmcache.utils import CacheEngineKey

    return CacheEngineKey("crash", 1, 0, i, torch.half)


@pytest.mark.timeout(60)
def test_batched_get_right_after_put_does_not_deadlock_the_pool(tmp_path: Path) -> None:
    config = make_config(
        local_disk=str(tmp_path),
        max_local_disk_size="1MiB",
        extra_config={"local_disk.num_workers": 1},
    )
    cpu = LocalCPUBackend(make_config(local_cpu=False))
    disk = LocalDiskBackend(config, cpu)
    keys = [make_key(i) for i in range(4)]
    objs = []
    for i in range(4):
        obj = cpu.allocate(torch.Size([2, 2, 16, 32]), torch.half)
        assert obj is not None
        obj.tensor.copy_(expected_tensor(i))
        objs.append(obj)
    disk.batched_submit_put_task(keys, objs)
    got = disk.batched_get_blocking(keys)
    assert all(
        g is not None and torch.equal(g.tensor, expected_tensor(i)) for i, g in enumerate(got)
    )
    for obj in [*objs, *got]:
        assert obj is not None
        obj.ref_count_down()
    disk.close()
    cpu.close()
