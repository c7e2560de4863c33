"""Segment names record their creator; only a provably gone creator's segment is unlinked."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lmcache.v1.platform.cpu.shm import (
    create_segment,
    creator_is_gone,
    current_creator,
    new_segment_name,
    segment_creator,
    unlink_orphaned_segment,
    unlink_segment,
)

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/ns/pid"), reason="Linux /proc needed"
)

_PRINT_NAME = "from lmcache.v1.platform.cpu.shm import new_segment_name; print(new_segment_name())"


def _name_of(pid: int, start: int, namespace: int) -> str:
    return f"/lmcache_kv_{pid}-{start}-{namespace}_0123456789abcdef"


def _exited_child_name() -> str:
    out = subprocess.run(
        [sys.executable, "-c", _PRINT_NAME], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_name_records_this_process_within_posix_limits() -> None:
    name = new_segment_name()
    assert name.startswith("/lmcache_kv_") and len(name) <= 255
    assert segment_creator(name) == current_creator()
    assert current_creator().pid == os.getpid() and current_creator().start_ticks > 0


def test_live_creator_is_not_gone() -> None:
    assert not creator_is_gone(new_segment_name())


def test_exited_creator_is_gone() -> None:
    assert creator_is_gone(_exited_child_name())


def test_reused_pid_is_told_apart_by_start_time() -> None:
    me = current_creator()
    assert creator_is_gone(_name_of(me.pid, me.start_ticks + 1, me.pid_namespace))
    assert not creator_is_gone(_name_of(me.pid, me.start_ticks, me.pid_namespace))


def test_zombie_creator_is_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _PRINT_NAME], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    name = proc.stdout.readline().strip()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # exited, not yet waited for: a zombie
            with open(f"/proc/{proc.pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        else:
            pytest.fail("the child never became a zombie")
        assert creator_is_gone(name)
    finally:
        proc.wait(10)
        proc.stdout.close()


@pytest.mark.parametrize(
    "name",
    [
        "/lmcache_kv_123_0123456789abcdef",  # the older pid_random format
        "/lmcache_kv_someone_elses_segment",
        "/lmcache_kv_1-0-0_0123456789abcdef",  # start time and namespace unknown
        "/lmcache_mp_1_0123456789abcdef",
    ],
)
def test_unknown_creators_are_never_gone(name: str) -> None:
    assert segment_creator(name) is None or not creator_is_gone(name)


def test_creator_in_another_pid_namespace_is_never_gone() -> None:
    me = current_creator()
    dead = segment_creator(_exited_child_name())
    assert dead is not None
    assert not creator_is_gone(_name_of(dead.pid, dead.start_ticks, me.pid_namespace + 1))


def test_unlink_orphaned_segment_unlinks_only_orphans() -> None:
    mine, _raw = create_segment(64)
    orphan, _raw2 = create_segment(64, shm_name=_exited_child_name())
    try:
        assert not unlink_orphaned_segment(mine)
        assert os.path.exists(f"/dev/shm/{mine.lstrip('/')}")
        assert unlink_orphaned_segment(orphan)
        assert not os.path.exists(f"/dev/shm/{orphan.lstrip('/')}")
    finally:
        unlink_segment(mine)
        unlink_segment(orphan)
