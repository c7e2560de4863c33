"""A small private tmpfs to fill to ENOSPC (the disk tier's health tests).

Imported as ``small_tmpfs`` (``tests/`` is on ``sys.path``, as for ``prerequisites``); the
fixture is shared through ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


class SmallTmpfs:
    """A private tmpfs of a few hundred KiB mounted in a temporary folder, to fill up."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return int(st.f_bavail * st.f_frsize)

    def fill(self, leave_bytes: int) -> Path:
        """Write a filler file so that at most ``leave_bytes`` stay free; returns it."""
        filler = self.path / f"filler-{uuid.uuid4().hex[:8]}"
        page = os.statvfs(self.path).f_frsize
        with open(filler, "wb") as f:
            while self.free_bytes() > leave_bytes:
                f.write(bytes(min(self.free_bytes() - leave_bytes, 1 << 16) or page))
                f.flush()
        return filler


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[[int], SmallTmpfs]]:
    """``mount(size_bytes)``: a fresh tmpfs of that size (unmounted at the end).  Mounting
    needs root (a fact of the machine, not of the set-up: a plain skip without it)."""
    mounted: list[Path] = []

    def mount(size_bytes: int) -> SmallTmpfs:
        target = tmp_path / f"tmpfs{len(mounted)}"
        target.mkdir()
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a private tmpfs needs root and mount(8)")
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(target)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounted.append(target)
        return SmallTmpfs(target)

    yield mount
    for target in mounted:
        subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=30)
