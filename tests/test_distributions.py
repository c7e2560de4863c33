"""``lmcache.distributions``: upstream's ``lmcache`` distribution installed over or beside
this core is one warning line at ``import lmcache``, with the fix; plugin metadata that
requires ``lmcache`` is recognised."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from nocore import write_upstream_metadata

from lmcache import distributions

WARNING_START = "upstream LMCache's distribution lmcache 0.5.6 is installed"


def _import_lmcache(tmp_path: Path, with_upstream: bool, owns: bool = True) -> str:
    site = tmp_path / "site"
    site.mkdir()
    if with_upstream:
        write_upstream_metadata(site, owns_package=owns)
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", "import lmcache"], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_import_says_so_once_with_the_fix(tmp_path: Path) -> None:
    lines = _import_lmcache(tmp_path, with_upstream=True).splitlines()
    mine = [line for line in lines if WARNING_START in line]
    assert len(mine) == 1, lines
    assert "both install the import package 'lmcache'" in mine[0]
    assert "pip uninstall -y lmcache lmcache-core && pip install" in mine[0]
    assert '"lmcache-core>=0.1,<0.2" instead of "lmcache"' in mine[0]


def test_import_is_quiet_without_upstream(tmp_path: Path) -> None:
    assert "upstream LMCache" not in _import_lmcache(tmp_path, with_upstream=False)


def test_upstream_beside_an_installed_core_is_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    write_upstream_metadata(site, owns_package=False)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(distributions, "installed_version", lambda name: "0.1.0")
    conflict = distributions.upstream_conflict()
    assert conflict is not None and "is installed beside lmcache-core 0.1.0" in conflict
    # Neither owning the package nor beside an installed core: nothing to say.
    monkeypatch.setattr(distributions, "installed_version", lambda name: None)
    assert distributions.upstream_conflict() is None


@pytest.mark.parametrize(
    ("requirement", "name"),
    [
        ("lmcache", "lmcache"),
        ("LMCache>=0.5", "lmcache"),
        ("lmcache[cuda] ; python_version >= '3.10'", "lmcache"),
        ("lmcache-core>=0.1,<0.2", "lmcache-core"),
        ("lmcache_core", "lmcache-core"),
        ("lmcache.core (>=0.1)", "lmcache-core"),
    ],
)
def test_requirement_names_are_normalized(requirement: str, name: str) -> None:
    assert distributions.requirement_name(requirement) == name


@pytest.mark.parametrize(
    ("version", "requirement"),
    [("0.1.0", "lmcache-core>=0.1,<0.2"), ("1.12.3", "lmcache-core>=1.12,<1.13")],
)
def test_core_requirement_is_the_minor_series(version: str, requirement: str) -> None:
    assert distributions.core_requirement(version) == requirement
