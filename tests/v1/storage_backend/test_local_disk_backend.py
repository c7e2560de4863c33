"""Disk tier: restart, eviction, corruption and a real SIGKILL proven to land mid-write."""

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
    CorruptFileError,
    LocalDiskBackend,
    file_name_for,
    read_header,
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
    import os, sys, time, torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_management import TensorMemoryObj
    from lmcache.v1.storage_backend import disk_files, local_disk_backend as ldb

    real_write_all = disk_files._write_all
    PIECE = 64 * 1024

    def reporting_write_all(f, data):
        # A slow disk that says where it is: after each piece, "W <tmp path> <offset>".
        # One os.write per line: atomic, so lines from pool threads never interleave.
        view = memoryview(data).cast("B")
        for start in range(0, len(view), PIECE):
            real_write_all(f, view[start:start + PIECE])
            os.write(1, f"W {f.name} {f.tell()}\\n".encode())
            time.sleep(0.002)

    disk_files._write_all = reporting_write_all
    config = LMCacheEngineConfig.from_defaults(
        local_disk=sys.argv[1], max_local_disk_size="1GB",
        extra_config={"local_disk.num_workers": 2})
    disk = ldb.LocalDiskBackend(config)
    i = 0
    in_flight = []
    while True:
        key = CacheEngineKey("crash", 1, 0, i, torch.half)
        data = torch.arange(512 * 1024, dtype=torch.float32).half() + i
        obj = TensorMemoryObj.from_tensor(data)
        for future in disk.batched_submit_put_task([key], [obj]):
            future.add_done_callback(lambda f, i=i: os.write(1, f"D {i}\\n".encode()))
            in_flight.append(future)
        obj.ref_count_down()
        while len(in_flight) > 2:
            in_flight.pop(0).result()
        i += 1
    """
)
MIN_COMPLETED = 5
MID_PAYLOAD = 4096  # past the prefix and JSON header: payload bytes are being written
KILL_ATTEMPTS = 10


def _is_incomplete_object(path: Path) -> bool:
    """True if ``path`` does not hold a whole object (the write was cut short)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        try:
            read_header(f, size)
        except CorruptFileError:
            return True
    return False


def _kill_mid_write(folder: Path) -> tuple[list[int], Path | None]:
    """Run the writer until ``MIN_COMPLETED`` puts are done, then SIGKILL it right after it
    reports a tmp file written past ``MID_PAYLOAD`` bytes.  Returns the completed puts, and
    that tmp file if the kill landed while it was still there and incomplete (else None)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(folder)], stdout=subprocess.PIPE, text=True
    )
    completed: list[int] = []
    reported_tmp: Path | None = None
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            kind, _, rest = line.partition(" ")
            if kind == "D":
                completed.append(int(rest))
            elif kind == "W" and len(completed) >= MIN_COMPLETED:
                path, _, offset = rest.rpartition(" ")
                if int(offset) > MID_PAYLOAD:
                    os.kill(proc.pid, signal.SIGKILL)
                    reported_tmp = Path(path)
                    break
    finally:
        # Also on a test timeout: an orphaned writer would fill the disk forever.
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert len(completed) >= MIN_COMPLETED, "writer did not complete enough puts"
    # Lines already in the pipe when the kill landed are puts that completed too.
    landed = reported_tmp is not None and reported_tmp.exists()
    if landed:
        assert reported_tmp is not None
        landed = reported_tmp.name.endswith(".tmp") and _is_incomplete_object(reported_tmp)
    return completed, reported_tmp if landed else None


def test_sigkill_mid_write_keeps_every_completed_put(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for attempt in range(KILL_ATTEMPTS):
        folder = tmp_path / f"attempt{attempt}"
        completed, partial = _kill_mid_write(folder)
        if partial is not None:
            break
    assert partial is not None, f"no kill landed mid-write in {KILL_ATTEMPTS} attempts"

    with caplog.at_level(logging.WARNING, logger="lmcache"):
        disk, cpu = _disk(folder, size="1GB")
    assert "corrupt" not in caplog.text  # renamed files were always complete
    assert not partial.exists()  # the unfinished write was ours: cleaned up
    assert not any(p.name.endswith(".tmp") for p in folder.iterdir())
    objects = [p for p in folder.iterdir() if p.name.endswith(FILE_SUFFIX)]
    assert len(disk) == len(objects) >= len(completed)  # the index is rebuilt from the folder
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
    assert "corrupt" not in caplog.text
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
