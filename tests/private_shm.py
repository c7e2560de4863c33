"""Run a command with a small private tmpfs on ``/dev/shm`` (a mount namespace of its own).

Tests of what happens when ``/dev/shm`` fills up, or of what is left in it, must neither
fill the machine's ``/dev/shm`` nor be disturbed by other processes' segments there: the
command runs under ``unshare --mount --propagation private`` with a fresh tmpfs of the given
size mounted on ``/dev/shm``, seen by it and its children only.  The command is also the
first process of a pid namespace of its own (``/proc`` remounted to match), so when it ends
or is killed (a timeout) every process it started ends with it: no server outlives a
failed test.  That needs ``unshare`` and the right to mount (root); a machine without them
is a missing prerequisite (:mod:`prerequisites`).

Imported as ``private_shm`` (``tests/`` is on ``sys.path``, like ``prerequisites``).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from prerequisites import require_prerequisite

_MOUNT_THEN_EXEC = 'mount -t tmpfs -o size="$0" tmpfs /dev/shm && exec "$@"'


def private_shm_command(size: str, command: Sequence[str]) -> list[str]:
    """``command`` run with a private ``size`` tmpfs (e.g. ``"64m"``) on ``/dev/shm``."""
    return ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child",
            "--mount-proc", "sh", "-c", _MOUNT_THEN_EXEC, size, *command]  # fmt: skip


@functools.cache
def _private_shm_works() -> tuple[bool, str]:
    if shutil.which("unshare") is None:
        return False, "the unshare command is not installed"
    try:
        probe = subprocess.run(
            private_shm_command("1m", ["true"]), capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"unshare failed: {exc}"
    if probe.returncode != 0:
        return False, f"cannot mount a private tmpfs (root needed): {probe.stderr.strip()}"
    return True, ""


def require_private_shm() -> None:
    """Skip locally (fail under nox/CI) where a private ``/dev/shm`` cannot be mounted."""
    works, reason = _private_shm_works()
    require_prerequisite("unshare + mount (private /dev/shm)", works, reason)


def run_with_private_shm(
    size: str,
    command: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    require_private_shm()
    return subprocess.run(
        private_shm_command(size, command),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ if env is None else env),
    )
