"""``lmcache demo``: skipped paths are reported as skipped, a failed server start shows the
server's own error, and no shared-memory segment outlives the demo."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lmcache.cli.commands import demo
from lmcache.utils import process_is_running

SHM_DIR = Path("/dev/shm")
SMALL = ["--tokens", "64", "--layers", "2"]


def _pid_of(name: str) -> int | None:
    parts = name.split("_")  # lmcache_mp_<pid>_<hex>, lmcache_kv_<pid>_<hex>
    return int(parts[2]) if len(parts) >= 4 and parts[2].isdigit() else None


@pytest.fixture
def no_orphan_segments() -> Iterator[None]:
    """Fail if a new lmcache segment belongs to a process that is gone (a leak)."""
    before = set(os.listdir(SHM_DIR))
    yield
    new = set(os.listdir(SHM_DIR)) - before
    orphans = sorted(
        n for n in new if n.startswith("lmcache_") and not process_is_running(_pid_of(n) or -1)
    )
    for name in orphans:
        (SHM_DIR / name).unlink(missing_ok=True)
    assert orphans == []


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_")}
    base["LMCACHE_LOG_LEVEL"] = "WARNING"
    return subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", "demo", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**base, **(env or {})},
    )


def test_start_server_failure_shows_the_servers_error(no_orphan_segments: None) -> None:
    result = _demo("--start-server", *SMALL, env={"LMCACHE_DEVICE_BACKEND": "nonexistent"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "exited during start-up" in result.stderr
    # the child's own one-line error, passed through
    assert "lmcache server: error: LMCACHE_DEVICE_BACKEND='nonexistent'" in result.stderr
    assert "all checks passed" not in result.stdout


def test_start_server_runs_both_paths_and_cleans_up(no_orphan_segments: None) -> None:
    result = _demo("--start-server", *SMALL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SKIPPED" not in result.stdout
    assert result.stdout.count("[ok] retrieved KV is bit-exact") == 2
    assert "all checks passed" in result.stdout


def test_nothing_ran_is_a_failure(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo._verdict([], list(demo.MODES)) == 1
    out = capsys.readouterr().out
    assert "nothing ran" in out and "passed" not in out


def test_failure_beats_skip(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo._verdict(["store"], ["engine_driven"]) == 1
    assert "1 check(s) FAILED; SKIPPED: engine_driven" in capsys.readouterr().out


@pytest.mark.parametrize("url", ["notaurl", "tcp://127.0.0.1:99999", "http://x:80"])
def test_bad_url_is_one_line_error(url: str) -> None:
    result = _demo("--url", url)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        line for line in result.stderr.strip().splitlines() if line.startswith("lmcache demo:")
    ]
    assert "argument --url" in result.stderr


MINIMAL_PLUGIN = """
    from lmcache.v1.platform.base.device_spec import DeviceSpec

    class MinimalSpec(DeviceSpec):
        device_type = property(lambda self: "mindev")
        torch_module_name = property(lambda self: "cpu")
        def is_available(self):
            return True
"""


def test_minimal_plugin_runs_engine_driven_and_skips_lmcache_driven(
    no_orphan_segments: None, installed_module: Callable[..., str]
) -> None:
    """Issue 20, gap 6: a spec with nothing but the required members (engine-driven only)
    is selected; the demo must not crash on the LMCache-driven path it cannot run."""
    path = installed_module("kit_minimal", MINIMAL_PLUGIN, {"mindev": "kit_minimal:MinimalSpec"})
    result = _demo("--start-server", *SMALL, env={"PYTHONPATH": path})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lmcache_driven: SKIPPED, backend 'mindev' declares no LMCache-driven" in result.stdout
    assert result.stdout.count("[ok] retrieved KV is bit-exact") == 1
