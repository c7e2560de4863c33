"""The disk tier owns its folder: a marker, its own file names, foreign entries untouched,
start refused on a foreign folder unless adopted, and folder fsyncs after renames."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import expected_tensor, make_config, make_key, put

from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import (
    FOLDER_LAYOUT_VERSION,
    MARKER_NAME,
    DiskFolderError,
    LocalDiskBackend,
    file_name_for,
    inspect_disk_folder,
)

TMP_LEFTOVER = "0123456789abcdef0123456789abcdef.lmc.89abcdef.tmp"
FOREIGN = {
    "notes.txt": b"somebody's notes",
    "backup.tmp": b"another program's temporary file",
    "model.lmc": b"not ours: the name is not a 32-digit digest",
    "0123456789ABCDEF0123456789ABCDEF.lmc": b"upper-case hex: not a name we write",
    "half.lmc.1234.tmp": b"not our temporary-file pattern",
}


@pytest.fixture
def cpu() -> Any:
    backend = LocalCPUBackend(make_config(local_cpu=False))
    yield backend
    backend.close()


def _disk(path: Path, cpu: LocalCPUBackend, **extra: Any) -> LocalDiskBackend:
    config = make_config(
        local_disk=str(path), max_local_disk_size="1MiB", extra_config=extra or None
    )
    return LocalDiskBackend(config, cpu)


def _snapshot(path: Path) -> dict[str, bytes | None]:
    """Every entry with its bytes (None for folders and links): proves nothing was touched."""
    return {
        p.name: None if p.is_dir() or p.is_symlink() else p.read_bytes() for p in path.iterdir()
    }


def _plant_foreign(path: Path) -> None:
    for name, data in FOREIGN.items():
        (path / name).write_bytes(data)
    (path / "subdir").mkdir()
    (path / "subdir" / "inner.tmp").write_bytes(b"x")


def test_empty_folder_starts_and_gets_a_marker(tmp_path: Path, cpu: LocalCPUBackend) -> None:
    disk = _disk(tmp_path / "new", cpu)  # created if missing
    marker = json.loads((tmp_path / "new" / MARKER_NAME).read_bytes())
    assert marker["layout_version"] == FOLDER_LAYOUT_VERSION
    assert marker["object_format_version"] == 2
    disk.close()
    disk2 = _disk(tmp_path / "new", cpu)  # a folder with our marker starts fine
    disk2.close()


def test_foreign_entries_refuse_start_and_stay_untouched(
    tmp_path: Path, cpu: LocalCPUBackend
) -> None:
    _plant_foreign(tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(DiskFolderError) as info:
        _disk(tmp_path, cpu)
    message = str(info.value)
    assert str(tmp_path) in message and "6 entries it did not write" in message
    assert "backup.tmp" in message and "and 1 more" in message  # the first five, sorted
    assert "adopt" in message
    assert _snapshot(tmp_path) == before  # nothing deleted, nothing added (no marker)
    assert (tmp_path / "subdir" / "inner.tmp").read_bytes() == b"x"


def test_foreign_files_in_a_marked_folder_also_refuse(tmp_path: Path, cpu: LocalCPUBackend) -> None:
    disk = _disk(tmp_path, cpu)
    put(disk, make_key(1), 1)
    disk.close()
    (tmp_path / "stray.tmp").write_bytes(b"dropped in later")
    with pytest.raises(DiskFolderError, match=r"stray\.tmp"):
        _disk(tmp_path, cpu)
    assert (tmp_path / "stray.tmp").read_bytes() == b"dropped in later"
    assert (tmp_path / file_name_for(make_key(1))).exists()


def test_a_link_with_our_name_is_foreign(tmp_path: Path, cpu: LocalCPUBackend) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"precious")
    folder = tmp_path / "tier"
    folder.mkdir()
    (folder / TMP_LEFTOVER).symlink_to(target)
    with pytest.raises(DiskFolderError, match=re.escape(TMP_LEFTOVER)):
        _disk(folder, cpu)
    assert (folder / TMP_LEFTOVER).is_symlink() and target.read_bytes() == b"precious"


@pytest.mark.parametrize("how", ["extra_config", "keyword"])
def test_adopt_starts_and_leaves_foreign_entries_untouched(
    tmp_path: Path, cpu: LocalCPUBackend, how: str
) -> None:
    _plant_foreign(tmp_path)
    before = _snapshot(tmp_path)
    if how == "extra_config":
        disk = _disk(tmp_path, cpu, **{"local_disk.adopt": True})
    else:
        config = make_config(local_disk=str(tmp_path), max_local_disk_size="1MiB")
        disk = LocalDiskBackend(config, cpu, adopt=True)
    assert len(disk) == 0 and disk.used_bytes == 0  # foreign bytes are not counted
    put(disk, make_key(3), 3)
    obj = disk.get_blocking(make_key(3))
    assert obj is not None and torch.equal(obj.tensor, expected_tensor(3))
    obj.ref_count_down()
    disk.close()
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before
    assert set(after) - set(before) == {MARKER_NAME, file_name_for(make_key(3))}
    # Adopting is per start: without the option the foreign entries still refuse it.
    with pytest.raises(DiskFolderError):
        _disk(tmp_path, cpu)
    disk2 = _disk(tmp_path, cpu, **{"local_disk.adopt": True})
    assert disk2.contains(make_key(3))
    disk2.close()
    assert {k: v for k, v in _snapshot(tmp_path).items() if k in before} == before


def test_own_leftovers_are_cleaned_and_lost_found_is_ignored(
    tmp_path: Path, cpu: LocalCPUBackend
) -> None:
    disk = _disk(tmp_path, cpu)
    put(disk, make_key(1), 1)
    disk.close()
    (tmp_path / TMP_LEFTOVER).write_bytes(b"partial")
    (tmp_path / f"{MARKER_NAME}.0badcafe.tmp").write_bytes(b"{")
    (tmp_path / "lost+found").mkdir()
    disk2 = _disk(tmp_path, cpu)
    assert disk2.contains(make_key(1))
    disk2.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [MARKER_NAME, "lost+found", file_name_for(make_key(1))]
    )


def test_folder_of_an_earlier_version_without_marker_is_adopted(
    tmp_path: Path, cpu: LocalCPUBackend
) -> None:
    disk = _disk(tmp_path, cpu)
    for i in range(3):
        put(disk, make_key(i), i)
    disk.close()
    (tmp_path / MARKER_NAME).unlink()  # what the previous version left: objects only
    (tmp_path / TMP_LEFTOVER).write_bytes(b"partial")
    disk2 = _disk(tmp_path, cpu)
    assert disk2.batched_contains([make_key(i) for i in range(3)]) == 3
    disk2.close()
    assert (tmp_path / MARKER_NAME).exists() and not (tmp_path / TMP_LEFTOVER).exists()


def test_newer_layout_or_bad_marker_is_refused(tmp_path: Path, cpu: LocalCPUBackend) -> None:
    marker = tmp_path / MARKER_NAME
    marker.write_text(json.dumps({"layout_version": FOLDER_LAYOUT_VERSION + 1}))
    with pytest.raises(DiskFolderError, match="layout version"):
        _disk(tmp_path, cpu, **{"local_disk.adopt": True})
    marker.write_text("garbage")
    with pytest.raises(DiskFolderError, match="not valid"):
        _disk(tmp_path, cpu)
    disk = _disk(tmp_path, cpu, **{"local_disk.adopt": True})  # adopting rewrites it
    disk.close()
    assert json.loads(marker.read_text())["layout_version"] == FOLDER_LAYOUT_VERSION


def test_inspect_changes_nothing_and_refuses_a_file(tmp_path: Path) -> None:
    assert not inspect_disk_folder(str(tmp_path / "missing")).marked
    assert not (tmp_path / "missing").exists()
    _plant_foreign(tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(DiskFolderError):
        inspect_disk_folder(str(tmp_path))
    assert inspect_disk_folder(str(tmp_path), adopt=True).foreign == 6
    assert _snapshot(tmp_path) == before
    with pytest.raises(DiskFolderError, match="not a folder"):
        inspect_disk_folder(str(tmp_path / "notes.txt"))


class _FsyncLog:
    """Replaces ``os.fsync``: records what each fd was and what the folder held then."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.calls: list[tuple[str, list[str]]] = []
        self._real = os.fsync

    def __call__(self, fd: int) -> None:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        target = os.readlink(f"/proc/self/fd/{fd}")
        kind = "dir" if is_dir and target == str(self.folder) else "file"
        self.calls.append((kind, sorted(os.listdir(self.folder))))
        self._real(fd)


def test_folder_is_fsynced_after_each_rename(
    tmp_path: Path, cpu: LocalCPUBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _disk(tmp_path, cpu)
    log = _FsyncLog(tmp_path)
    monkeypatch.setattr(os, "fsync", log)
    put(disk, make_key(1), 1)
    final = file_name_for(make_key(1))
    kinds = [kind for kind, _ in log.calls]
    assert kinds == ["file", "dir"]
    assert final not in log.calls[0][1]  # the file fsync happens before the rename ...
    assert log.calls[1][1] == sorted([MARKER_NAME, final])  # ... the folder's after it
    disk.close()


def test_start_up_cleanup_fsyncs_the_folder(
    tmp_path: Path, cpu: LocalCPUBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    _disk(tmp_path, cpu).close()
    (tmp_path / TMP_LEFTOVER).write_bytes(b"partial")
    log = _FsyncLog(tmp_path)
    monkeypatch.setattr(os, "fsync", log)
    _disk(tmp_path, cpu).close()
    assert ("dir", [MARKER_NAME]) in log.calls  # after the unlink of the leftover


def test_marker_write_fsyncs_file_and_folder(
    tmp_path: Path, cpu: LocalCPUBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _FsyncLog(tmp_path)
    monkeypatch.setattr(os, "fsync", log)
    _disk(tmp_path, cpu).close()
    assert [kind for kind, _ in log.calls] == ["file", "dir"]
    assert log.calls[1][1] == [MARKER_NAME]


def test_no_fsync_option_skips_folder_fsyncs(
    tmp_path: Path, cpu: LocalCPUBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _disk(tmp_path, cpu, **{"local_disk.fsync": False})
    log = _FsyncLog(tmp_path)
    monkeypatch.setattr(os, "fsync", log)
    put(disk, make_key(1), 1)
    assert log.calls == []
    disk.close()
