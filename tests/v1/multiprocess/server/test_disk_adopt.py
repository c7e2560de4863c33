"""``lmcache server`` refuses a disk-tier folder holding foreign files unless told to adopt
it (``--l2-disk-adopt`` or ``"adopt": true`` in a disk ``--l2-adapter``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from mp_server_helpers import BASE_ARGS, ServerProcess

from lmcache.v1.multiprocess.server.startup import parse_l2_adapter
from lmcache.v1.storage_backend.local_disk_backend import MARKER_NAME
from lmcache.v1.storage_backend.tier_settings import disk_adopt

# SHM off: a refused start must not depend on (or leave) a shared-memory segment.
NO_SHM = ["--shm-name", ""]


def _foreign_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "report.tmp").write_bytes(b"another program's file")
    return folder


@pytest.mark.parametrize("shm", [False, True], ids=["no-shm", "shm"])
def test_foreign_folder_is_refused_with_its_name(tmp_path: Path, shm: bool) -> None:
    folder = _foreign_folder(tmp_path)
    disk = ["--l2-disk-path", str(folder), "--l2-disk-size-gb", "0.01"]
    server = ServerProcess([*BASE_ARGS, *([] if shm else NO_SHM), *disk], tmp_path / "server.log")
    try:
        server.proc.wait(60)
    finally:
        server.stop()
    assert server.proc.returncode != 0
    log = server.log_path.read_text()
    assert str(folder) in log and "report.tmp" in log and "--l2-disk-adopt" in log
    assert (folder / "report.tmp").read_bytes() == b"another program's file"
    assert not (folder / MARKER_NAME).exists()
    # The folder is checked before L1 exists: a refused start leaves no shared memory.
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"lmcache_mp_{server.proc.pid}_")]


@pytest.mark.parametrize("how", ["flag", "adapter"])
def test_adopted_folder_serves_and_keeps_foreign_files(tmp_path: Path, how: str) -> None:
    folder = _foreign_folder(tmp_path)
    if how == "flag":
        disk = ["--l2-disk-path", str(folder), "--l2-disk-size-gb", "0.01", "--l2-disk-adopt"]
    else:
        spec = {"type": "disk", "path": str(folder), "size_gb": 0.01, "adopt": True}
        disk = ["--l2-adapter", json.dumps(spec)]
    server = ServerProcess([*BASE_ARGS, *NO_SHM, *disk], tmp_path / "server.log")
    try:
        server.wait_ready()
        with server.client() as client:
            assert client.ping()
    finally:
        assert server.stop() == 0, server.log()
    assert (folder / "report.tmp").read_bytes() == b"another program's file"
    assert (folder / MARKER_NAME).exists()


def test_adopt_in_the_adapter_must_be_a_boolean() -> None:
    spec = parse_l2_adapter('{"type": "disk", "path": "/data", "adopt": "yes"}')
    with pytest.raises(ValueError, match='"adopt" must be true or false'):
        disk_adopt(False, [spec])
    assert disk_adopt(True, []) is True
    assert disk_adopt(False, [parse_l2_adapter('{"type": "disk", "path": "/d"}')]) is False
