"""Fixtures for the CLI tests: plugins "installed" without pip.

``installed_plugins`` writes a ``*.dist-info`` folder (METADATA + entry_points.txt) into a
temporary folder, the same files a wheel installs, and returns a ``PYTHONPATH`` that puts
it and the plugins' sources first: ``importlib.metadata`` then discovers the entry points
exactly as it does for an installed wheel, in a fresh interpreter.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the suite runs on 3.11+
    tomllib = pytest.importorskip("tomli")

TEST_PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def write_dist(
    site: Path, dist: str, entry_points: Mapping[str, str], requires: Sequence[str] = ()
) -> None:
    """A ``*.dist-info`` of ``dist`` 0.0.1 with its ``lmcache.device_plugins`` entry points
    and ``Requires-Dist`` lines."""
    info = site / f"{dist.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n{lines}")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[lmcache.device_plugins]\n{lines}")


def _python_path(*dirs: Path) -> str:
    parts = [str(d) for d in dirs] + [p for p in [os.environ.get("PYTHONPATH", "")] if p]
    return os.pathsep.join(parts)


@pytest.fixture
def installed_plugins(tmp_path: Path) -> Callable[..., str]:
    """Install the named ``tests/plugins/<name>`` projects; returns the PYTHONPATH."""

    def install(*names: str) -> str:
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        sources = [TEST_PLUGINS / "base" / "src"]
        for name in names:
            project = tomllib.loads((TEST_PLUGINS / name / "pyproject.toml").read_text())
            eps = project["project"]["entry-points"]["lmcache.device_plugins"]
            write_dist(site, project["project"]["name"], eps)
            sources.append(TEST_PLUGINS / name / "src")
        return _python_path(site, *sources)

    return install


@pytest.fixture
def installed_module(tmp_path: Path) -> Callable[..., str]:
    """Install one inline module as a distribution with the given entry points."""

    def install(
        module: str, source: str, entry_points: Mapping[str, str], requires: Sequence[str] = ()
    ) -> str:
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        write_dist(site, f"lmcache-inline-{module.replace('_', '-')}", entry_points, requires)
        return _python_path(site)

    return install


@pytest.fixture
def dist_info() -> Callable[..., None]:
    """:func:`write_dist`, for a test that lays out its own site folder."""
    return write_dist
