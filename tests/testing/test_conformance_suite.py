"""``pytest --pyargs lmcache.testing --lmcache-backend cpu`` certifies the in-tree cpu
backend from an unrelated folder, as a vendor runs it against an installed wheel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def _run_suite(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    # -p: the pytest11 entry point of an installed core wheel registers the same plugin;
    # a source checkout (PYTHONPATH) has no entry point, so name it explicitly.
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "lmcache.testing.plugin", "-p",
         "no:cacheprovider", "--pyargs", "lmcache.testing", "-q", *args],
        cwd=cwd, env={**os.environ, "LMCACHE_TESTING_EXAMPLES": "15", **(env or {})},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc.stdout


def test_suite_passes_for_cpu_with_a_non_zero_count(tmp_path: Path) -> None:
    out = _run_suite(tmp_path, "--lmcache-backend", "cpu")
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) > 100, out[-2000:]
    assert "failed" not in out and "error" not in out.lower()


def test_unknown_backend_fails(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="backend 'nosuch' is not registered"):
        _run_suite(tmp_path, "-x", "-k", "names_are_lowercase", env={
            "LMCACHE_TESTING_BACKEND": "nosuch"})  # fmt: skip
