"""``reclaim_orphaned_segments``: segments whose creator provably exited are unlinked and
logged; a live process's, another pid namespace's and unprovable ones are left alone.

Most cases run on a scratch directory (the function takes the directory to scan), so the
machine's ``/dev/shm`` and other processes' segments in it are never touched.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from private_shm import run_with_private_shm

from lmcache.v1.platform.cpu.shm import (
    ReclaimedSegment,
    current_creator,
    new_l1_segment_name,
    new_segment_name,
    reclaim_orphaned_segments,
    segment_creator,
)

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/ns/pid"), reason="Linux /proc needed"
)

_PRINT_NAMES = (
    "import json\n"
    "from lmcache.v1.platform.cpu.shm import new_l1_segment_name, new_segment_name\n"
    "print(json.dumps([new_l1_segment_name(), new_segment_name().lstrip('/')]))"
)
_LOGGER = "lmcache.v1.platform.cpu.shm"


def _names_of_an_exited_process() -> list[str]:
    """An L1 and a KV segment name whose creator has exited (and was waited for)."""
    out = subprocess.run(
        [sys.executable, "-c", _PRINT_NAMES], capture_output=True, text=True, check=True
    )
    return list(json.loads(out.stdout))


def _segment(directory: Path, name: str, nbytes: int = 8192) -> Path:
    path = directory / name.lstrip("/")
    with open(path, "wb") as f:
        f.write(b"\1" * nbytes)
    return path


def test_l1_name_records_this_process_and_keeps_the_pid_glob() -> None:
    name = new_l1_segment_name()
    assert name.startswith(f"lmcache_mp_{os.getpid()}_")  # what `lmcache_mp_<pid>_*` finds
    assert segment_creator(name) == current_creator()


def test_segments_of_an_exited_creator_are_reclaimed_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    l1, kv = _names_of_an_exited_process()
    dead_pid = segment_creator(l1).pid  # type: ignore[union-attr]
    _segment(tmp_path, l1, 3 * 4096)
    _segment(tmp_path, kv, 4096)
    with caplog.at_level(logging.WARNING, logger=_LOGGER):
        reclaimed = reclaim_orphaned_segments(str(tmp_path))
    assert sorted(reclaimed, key=lambda r: r.name) == [
        ReclaimedSegment(kv, 4096, dead_pid),
        ReclaimedSegment(l1, 3 * 4096, dead_pid),
    ]
    assert list(tmp_path.iterdir()) == []
    logged = sorted(r.getMessage() for r in caplog.records)
    assert len(logged) == 2
    for message, (name, nbytes) in zip(logged, [(kv, 4096), (l1, 3 * 4096)]):
        assert name in message and f"({nbytes} bytes)" in message
        assert f"pid {dead_pid}, exited" in message


def test_live_and_unprovable_segments_are_left_alone(tmp_path: Path) -> None:
    me = current_creator()
    l1_dead, _kv_dead = _names_of_an_exited_process()
    dead = segment_creator(l1_dead)
    assert dead is not None
    other_ns = me.pid_namespace + 1
    kept = [
        new_l1_segment_name(),  # this live process's L1
        new_segment_name(),  # and KV segment
        # Another pid namespace: its pids mean nothing here, whether the pid here is a live
        # process with another start time (this one) or no process at all.
        f"lmcache_mp_{me.pid}_{me.start_ticks + 1}-{other_ns}_0123456789ab",
        f"lmcache_kv_{dead.pid}-{dead.start_ticks}-{other_ns}_0123456789abcdef",
        # No start time recorded (the older name format): an exited pid alone proves nothing.
        f"lmcache_mp_{dead.pid}_0123456789ab",
        f"lmcache_kv_{dead.pid}_0123456789abcdef",
        f"lmcache_mp_{dead.pid}_0-{me.pid_namespace}_0123456789ab",
        # Not ours at all.
        f"other_{dead.pid}-{dead.start_ticks}-{me.pid_namespace}_0123456789abcdef",
        "lmcache-autostart-5555.lock",
    ]
    for name in kept:
        _segment(tmp_path, name)
    assert reclaim_orphaned_segments(str(tmp_path)) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n.lstrip("/") for n in kept)


def test_a_reused_pid_does_not_keep_a_dead_creators_segment(tmp_path: Path) -> None:
    """The pid now belongs to another process (this one, started at another time): the
    segment's creator is gone, so the segment is reclaimed, and this process's own is not."""
    me = current_creator()
    reused = f"lmcache_mp_{me.pid}_{me.start_ticks - 1}-{me.pid_namespace}_0123456789ab"
    mine = new_l1_segment_name()
    _segment(tmp_path, reused)
    _segment(tmp_path, mine)
    assert [r.name for r in reclaim_orphaned_segments(str(tmp_path))] == [reused]
    assert [p.name for p in tmp_path.iterdir()] == [mine]


def test_a_missing_directory_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=_LOGGER):
        assert reclaim_orphaned_segments(str(tmp_path / "absent")) == []
    assert "cannot list" in caplog.text


# Inside a private /dev/shm: a segment made by a process in another pid namespace (it was
# pid 1 there and has exited) and one made by an exited process of this namespace.
_OTHER_NAMESPACE = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from lmcache.v1.platform.cpu.shm import reclaim_orphaned_segments

    make = (
        "from lmcache.v1.platform.cpu.shm import create_segment, new_l1_segment_name\\n"
        "print(create_segment(4096, new_l1_segment_name())[0])"
    )
    def made_by(prefix):
        out = subprocess.run([*prefix, sys.executable, "-c", make], capture_output=True,
                             text=True, check=True)
        return out.stdout.strip()

    foreign = made_by(["unshare", "--pid", "--fork"])
    local = made_by([])
    reclaimed = [r.name for r in reclaim_orphaned_segments()]
    print(json.dumps({"foreign": foreign, "local": local, "reclaimed": reclaimed,
                      "left": sorted(os.listdir("/dev/shm"))}))
    """
)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")
def test_a_segment_from_another_pid_namespace_is_left_alone() -> None:
    proc = run_with_private_shm("8m", [sys.executable, "-c", _OTHER_NAMESPACE], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["foreign"].startswith("lmcache_mp_1_"), result  # pid 1 of its namespace
    assert result["reclaimed"] == [result["local"]]
    assert result["left"] == [result["foreign"]]
