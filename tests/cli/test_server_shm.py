"""``lmcache server`` and a small or crowded ``/dev/shm``: no SIGBUS, no leak.

Each case runs tests/cli/shm_scenarios.py in a private tmpfs on ``/dev/shm``
(:mod:`private_shm`), so it neither fills the machine's ``/dev/shm`` nor meets other
processes' segments there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from private_shm import run_with_private_shm

SCENARIOS = str(Path(__file__).with_name("shm_scenarios.py"))
L1_GB = 0.0625  # 64 MiB: a whole number of pages and of allocator blocks
L1_BYTES = 64 * 1024**2

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux tmpfs")


def _scenario(tmpfs_size: str, *args: str, timeout: float = 280) -> dict[str, Any]:
    proc = run_with_private_shm(tmpfs_size, [sys.executable, SCENARIOS, *args], timeout)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("servers", "tmpfs_mib"),
    [
        (2, 96),  # room for one
        pytest.param(8, 224, marks=pytest.mark.slow),  # room for three
    ],
)
def test_servers_starting_together_each_run_or_are_refused_cleanly(
    servers: int, tmpfs_mib: int
) -> None:
    """Every server passes the size check before any allocates (the race of two servers
    starting together): as many as fit run, the others get the one-line refusal, none dies
    by a signal, and nothing of theirs is left in /dev/shm once they stop."""
    result = _scenario(f"{tmpfs_mib}m", "concurrent", str(servers), "--l1-size-gb", str(L1_GB))
    assert result["passed_size_check"] == servers, result
    outcomes = result["outcomes"]
    fit = tmpfs_mib * 1024**2 // L1_BYTES
    assert sorted(outcomes) == ["ran"] * fit + ["refused"] * (servers - fit), result
    for refusal in result["refusals"]:
        assert "cannot reserve 0.06 GiB of shared memory" in refusal, refusal
        assert "No space left on device" in refusal, refusal
    assert len(result["shm_while_running"]) == fit, result
    assert result["shm_left"] == {}, result


@pytest.mark.slow
@pytest.mark.timeout(600)  # 22 server starts; its own limit (560 s) comes first
def test_crash_loop_of_killed_servers_does_not_grow_dev_shm() -> None:
    """20 servers SIGKILLed after start-up, beside a live neighbour: each start reclaims
    what the previous kill left, never the neighbour's segment."""
    kills = 20
    result = _scenario("1g", "crash-loop", str(kills), "--l1-size-gb", str(L1_GB), timeout=560)
    assert result["kill_return_codes"] == [-9], result
    neighbour = result["used_before"]
    assert L1_BYTES <= neighbour < 2 * L1_BYTES, result  # the neighbour's L1 alone
    # After each kill: the neighbour's L1 and the one just killed, never more.
    assert max(result["used_after_each_kill"]) <= neighbour + L1_BYTES, result
    assert result["neighbour_alive"] and result["neighbour_segment_kept"], result
    assert result["neighbour_stop_rc"] == 0 and result["final_stop_rc"] == 0, result
    assert result["reclaimed_lines"] == kills, result
    assert result["left_at_end"] == {} and result["used_at_end"] == 0, result
