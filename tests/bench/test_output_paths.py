"""``lmcache bench ... --json/--plot`` check their output path before measuring anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = ("ops", "storage", "server", "prefetch")


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", "bench", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, LMCACHE_LOG_LEVEL="WARNING"),
    )


@pytest.mark.parametrize("benchmark", BENCHMARKS)
@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_output_into_a_missing_folder_fails_before_the_run(
    tmp_path: Path, benchmark: str, flag: str
) -> None:
    target = tmp_path / "missing" / "out.file"
    result = _bench(benchmark, "--quick", flag, str(target))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"lmcache bench {benchmark}: error: argument {flag}: folder "
        f"'{target.parent}' of '{target}' does not exist"
    )
    assert result.stdout == ""  # nothing was measured


def test_output_that_is_a_directory(tmp_path: Path) -> None:
    result = _bench("ops", "--quick", "--json", str(tmp_path))
    assert result.returncode == 1
    assert "is a directory" in result.stderr
