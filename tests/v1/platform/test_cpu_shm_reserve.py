"""Shared-memory segments are reserved whole when created: a full ``/dev/shm`` is an
``OSError`` at creation, never a SIGBUS when a page is first touched, and leaves no name."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
from private_shm import run_with_private_shm

from lmcache.v1.platform.cpu.shm import SHM_DIR, create_segment, unlink_segment

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux tmpfs")


def test_created_segment_holds_all_of_its_pages() -> None:
    """A sparse segment holds no pages until touched (the SIGBUS risk); a reserved one
    holds every page from the start."""
    size = 4 * 1024 * 1024
    name, raw = create_segment(size)
    try:
        held = os.stat(os.path.join(SHM_DIR, name.lstrip("/"))).st_blocks * 512
        assert held >= size
        assert raw.numel() == size and int(raw.sum()) == 0
    finally:
        unlink_segment(name)


# Runs inside a private 16 MiB /dev/shm: each way of making a segment, asked for more than
# fits, must raise (not die by SIGBUS) and leave /dev/shm empty.
_TOO_BIG = textwrap.dedent(
    """
    import json, os
    import torch
    from lmcache.integration.vllm.cpu_shm_remap import remap_storage_to_shm
    from lmcache.v1.memory.shm import create_host_segment
    from lmcache.v1.platform.cpu.shm import empty_shm_tensor

    big = 32 * 1024 * 1024
    attempts = {
        "create_host_segment (L1)": lambda: create_host_segment(big)[1].fill_(1),
        "empty_shm_tensor (worker KV)": lambda: empty_shm_tensor((big,), torch.uint8).fill_(1),
        "remap_storage_to_shm (vLLM KV)": lambda: remap_storage_to_shm(torch.ones(big // 4)),
    }
    result = {}
    for what, attempt in attempts.items():
        try:
            attempt()
            result[what] = "created"
        except OSError as exc:
            result[what] = str(exc)
        result[what + " left"] = sorted(os.listdir("/dev/shm"))
    print(json.dumps(result))
    """
)


def test_segment_larger_than_free_shm_is_an_error_and_leaves_nothing() -> None:
    proc = run_with_private_shm("16m", [sys.executable, "-c", _TOO_BIG], timeout=120)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for what in ("create_host_segment (L1)", "empty_shm_tensor (worker KV)",
                 "remap_storage_to_shm (vLLM KV)"):  # fmt: skip
        assert result[what].startswith("cannot reserve 0.03 GiB of shared memory"), result
        assert "No space left on device" in result[what], result
        assert result[what + " left"] == [], result


# Inside a private /dev/shm (holding the lock on the machine's would stall every other
# process's reservations): a reservation waits while another holds the turn, and goes
# ahead alone, with a warning, once the turn is held past RESERVE_LOCK_WAIT_S.
_TURNS = textwrap.dedent(
    """
    import fcntl, json, logging, os, threading
    from lmcache.v1.platform.cpu import shm

    warnings = []

    class Collect(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logging.getLogger(shm.__name__).addHandler(Collect())

    def reserve_in_thread():
        # Daemon so a stuck one cannot hold exit; joined (not just signalled) before exit,
        # because a thread still inside torch at interpreter teardown aborts the process.
        target = lambda: shm.unlink_segment(shm.create_segment(4096)[0])  # noqa: E731
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        return thread

    def finished(thread, timeout):
        thread.join(timeout)
        return not thread.is_alive()

    other = os.open(shm.SHM_DIR, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(other, fcntl.LOCK_EX)  # another reservation under way
    first = reserve_in_thread()
    waited = not finished(first, 1.0)
    fcntl.flock(other, fcntl.LOCK_UN)
    finished_after_turn = finished(first, 30)

    shm.RESERVE_LOCK_WAIT_S = 0.2
    fcntl.flock(other, fcntl.LOCK_EX)  # held on and on (a stopped process)
    finished_alone = finished(reserve_in_thread(), 30)
    print(json.dumps({"waited": waited, "finished_after_turn": finished_after_turn,
                      "finished_alone": finished_alone, "warnings": warnings}))
    """
)


def test_reservations_take_turns_and_never_wait_forever() -> None:
    proc = run_with_private_shm("8m", [sys.executable, "-c", _TURNS], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["waited"] and result["finished_after_turn"], result
    assert result["finished_alone"], result
    assert len(result["warnings"]) == 1 and "reserving without waiting" in result["warnings"][0]
