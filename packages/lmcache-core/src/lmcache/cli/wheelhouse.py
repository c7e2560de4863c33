"""``lmcache plugin wheelhouse DIR``: the lmcache-core wheel a plugin repository installs from.

lmcache-core is not on a package index, so a plugin repository outside this checkout
finds it in a wheelhouse (``pip install --find-links DIR``; the scaffold's noxfile and CI
read the folder from ``LMCACHE_WHEELHOUSE``).  The wheel is of the core this command runs
from:

* from a source tree (an editable install, or ``PYTHONPATH`` pointing at ``src/``):
  ``pip wheel --no-deps`` of that project;
* from an installed wheel: the installed files, packed again with their own metadata
  (``WHEEL``, ``METADATA``, ``entry_points.txt``) and a fresh ``RECORD`` (console scripts
  are left out: an installer writes them again from ``entry_points.txt``).

Only the core goes in.  Its dependencies (torch, numpy, ...) and its ``testing`` extra
(pytest, hypothesis) are on PyPI and the PyTorch index; for an offline machine add them
with ``pip download --dest DIR --find-links DIR "lmcache-core[testing]"``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import logging
import subprocess
import sys
import zipfile
from pathlib import Path

import lmcache
from lmcache.distributions import CORE_DISTRIBUTION

logger = logging.getLogger(__name__)

# Installer bookkeeping that is not part of a wheel.
_NOT_IN_WHEEL = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}


def source_project() -> Path | None:
    """The lmcache-core project folder the running ``lmcache`` package was imported from."""
    package = Path(lmcache.__file__).resolve().parent
    project = package.parent.parent  # <project>/src/lmcache
    pyproject = project / "pyproject.toml"
    if package.parent.name != "src" or not pyproject.is_file():
        return None
    return project if f'name = "{CORE_DISTRIBUTION}"' in pyproject.read_text() else None


def build_from_source(project: Path, dest: Path) -> Path:
    """``pip wheel --no-deps`` of the project into ``dest``; without build isolation
    when setuptools is importable (no index needed)."""
    before = set(dest.glob("lmcache_core-*.whl"))
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation,
               "--wheel-dir", str(dest), str(project)]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"building the lmcache-core wheel from {project} failed:\n{tail}")
    wheels = sorted(set(dest.glob("lmcache_core-*.whl")) - before) or sorted(
        dest.glob("lmcache_core-*.whl"), key=lambda w: w.stat().st_mtime
    )
    return wheels[-1]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _wheel_tag(dist: importlib.metadata.Distribution) -> str:
    wheel_file = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel_file.splitlines()
            if line.startswith("Tag:")]  # fmt: skip
    if len(tags) != 1:
        raise RuntimeError(
            f"the installed {CORE_DISTRIBUTION} has no single wheel Tag in its WHEEL file "
            f"({tags}); build the wheel from a checkout instead (nox -s build)"
        )
    return tags[0]


def _installed_files(dist: importlib.metadata.Distribution) -> list[tuple[str, bytes]]:
    files = []
    for path in dist.files or []:
        name = path.as_posix()
        if name.startswith("..") or "__pycache__" in path.parts or name.endswith(".pyc"):
            continue
        if path.parent.name.endswith(".dist-info") and path.name in _NOT_IN_WHEEL:
            continue
        files.append((name, Path(str(dist.locate_file(path))).read_bytes()))
    return files


def repack_installed(dest: Path) -> Path:
    """The installed lmcache-core, packed again as the wheel it was installed from."""
    dist = importlib.metadata.distribution(CORE_DISTRIBUTION)
    if (
        Path(str(dist.locate_file("lmcache/__init__.py"))).resolve()
        != Path(lmcache.__file__).resolve()
    ):
        raise RuntimeError(
            f"the running lmcache package ({lmcache.__file__}) is not the installed "
            f"{CORE_DISTRIBUTION} {dist.version}'s files, and has no source tree to build from"
        )
    files = _installed_files(dist)
    info = next(
        name.split("/", 1)[0] for name, _ in files if name.split("/", 1)[0].endswith(".dist-info")
    )
    name, version = info[: -len(".dist-info")].rsplit("-", 1)
    wheel = dest / f"{name}-{version}-{_wheel_tag(dist)}.whl"
    record = [_record_line(path, data) for path, data in files]
    record.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, data in files:
            archive.writestr(path, data)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def write_core_wheel(dest: Path) -> Path:
    """Put the running core's wheel into ``dest`` (created if missing); its path."""
    dest.mkdir(parents=True, exist_ok=True)
    project = source_project()
    if project is not None:
        logger.info("building the lmcache-core wheel from %s", project)
        return build_from_source(project, dest)
    logger.info("packing the installed lmcache-core into a wheel")
    return repack_installed(dest)
