"""A Python without lmcache: fresh venvs that see this interpreter's other packages.

Tests of what pip resolves and of a plugin repository's own ``nox -s tests`` need an
interpreter where lmcache-core is *not* installed (it must come from a wheelhouse) but
torch, pip, pytest, setuptools, ... are (no index, no download).  Imported as ``nocore``
(``tests/`` is on ``sys.path``, like ``prerequisites``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

# Env vars that steer backend selection (as tests/conftest.py's SELECTION_ENV_VARS).
_SELECTION_ENV_VARS = ("DEVICE_TYPE", "LMCACHE_DEVICE_BACKEND", "LMCACHE_DEVICE_PLUGINS_AUTOLOAD",
                       "LMCACHE_TESTING_BACKEND")  # fmt: skip


def _is_lmcache_entry(entry: os.DirEntry[str]) -> bool:
    name = entry.name.lower()
    if name.startswith("lmcache") or (name.startswith("__editable__") and "lmcache" in name):
        return True
    if name.endswith(".pth") and entry.is_file():
        with open(entry.path, encoding="utf-8", errors="replace") as handle:
            return "lmcache" in handle.read().lower()
    return False


def make_python_without_core(folder: Path, venv: Path | None = None) -> Path:
    """A fresh venv (``venv``, default ``folder/venv``; no pip of its own) that sees this
    interpreter's packages except every lmcache distribution and package: torch, pip,
    pytest, setuptools, ... are "installed" in it, so pip resolves them without an index,
    and lmcache-core (and a plugin) must come from where the test says.  Returns its
    python."""
    deps = folder / "deps-site"
    deps.mkdir(parents=True)
    with os.scandir(sysconfig.get_paths()["purelib"]) as entries:
        for entry in entries:
            if not _is_lmcache_entry(entry):
                (deps / entry.name).symlink_to(entry.path)
    venv = venv or folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                             check=True, env=_without_pythonpath()).stdout.strip()  # fmt: skip
    (Path(purelib) / "_deps_site.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    return python


def _without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def env_without_core(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for :func:`make_python_without_core`'s python: no PYTHONPATH (a
    source checkout on it would be the core), no backend selection, and pip offline,
    reading no configuration (a machine's find-links or index must not answer for the
    wheelhouse under test)."""
    drop = {"PYTHONPATH", *_SELECTION_ENV_VARS}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PIP_")}
    env.update(
        {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    )
    env.update(overrides or {})
    return env


def write_upstream_metadata(site: Path, owns_package: bool = True) -> Path:
    """The ``lmcache-0.5.6.dist-info`` upstream LMCache's wheel installs (its RECORD lists
    ``lmcache/__init__.py`` when ``owns_package``), without any of its files."""
    info = site / "lmcache-0.5.6.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lmcache\nVersion: 0.5.6\n")
    record = ["lmcache-0.5.6.dist-info/METADATA,,", "lmcache-0.5.6.dist-info/RECORD,,"]
    if owns_package:
        record.insert(0, "lmcache/__init__.py,sha256=x,1")
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return info
