"""Which installed distributions provide the ``lmcache`` import package.

lmcache-core and upstream LMCache's ``lmcache`` distribution install the same import
package.  Installing one over the other overwrites files, and a plugin whose metadata
requires ``lmcache`` (the pyproject of upstream's "Adding a New Device Backend" guide)
makes ``pip install`` pull upstream in over this core.  ``import lmcache`` says so in one
warning line with the fix; ``lmcache plugin check`` and ``lmcache devices`` also name each
plugin that requires ``lmcache``.

The import-time check lists ``sys.path`` folders only; ``importlib.metadata`` is imported
only when an ``lmcache-<version>.dist-info`` is actually there.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import importlib.metadata

logger = logging.getLogger(__name__)

CORE_DISTRIBUTION = "lmcache-core"
UPSTREAM_DISTRIBUTION = "lmcache"
WHEELHOUSE_ENV_VAR = "LMCACHE_WHEELHOUSE"
# The metadata folder of a distribution normalized to exactly "lmcache" (upstream's);
# lmcache-core's is lmcache_core-<version>.dist-info.
_UPSTREAM_METADATA = re.compile(r"^lmcache-\d[^-]*\.(dist|egg)-info$", re.IGNORECASE)
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_PACKAGE_INIT = "lmcache/__init__.py"


def core_requirement(version: str | None = None) -> str:
    """The range a plugin pins lmcache-core to: this minor series (``>=0.1,<0.2``)."""
    if version is None:
        from lmcache import __version__

        version = __version__
    major, minor = (int(part) for part in version.split(".")[:2])
    return f"{CORE_DISTRIBUTION}>={major}.{minor},<{major}.{minor + 1}"


def reinstall_fix() -> str:
    """The commands that put lmcache-core's files back after upstream overwrote them."""
    return (
        f"pip uninstall -y {UPSTREAM_DISTRIBUTION} {CORE_DISTRIBUTION} && pip install "
        f'--find-links "${WHEELHOUSE_ENV_VAR}" "{core_requirement()}", and make every plugin '
        f'depend on "{core_requirement()}" instead of "{UPSTREAM_DISTRIBUTION}"'
    )


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str | None:
    """The normalized distribution name a ``Requires-Dist`` line asks for."""
    match = _REQUIREMENT_NAME.match(requirement)
    return _normalize(match.group(1)) if match else None


def requires_upstream(dist: importlib.metadata.Distribution) -> list[str]:
    """The ``Requires-Dist`` entries of ``dist`` that name upstream's ``lmcache``."""
    return [r for r in dist.requires or [] if requirement_name(r) == UPSTREAM_DISTRIBUTION]


def upstream_requirement_problem(dist: importlib.metadata.Distribution) -> str | None:
    """Why a plugin distribution that requires ``lmcache`` must not be installed as is."""
    found = requires_upstream(dist)
    if not found:
        return None
    name = dist.metadata["Name"]
    return (
        f"{name} {dist.version} requires {', '.join(repr(r) for r in found)}: that is "
        f"upstream LMCache's distribution, not {CORE_DISTRIBUTION}; installed with its "
        f"dependencies it replaces this core's files (lmcache-core is not on a package index, "
        f"upstream's lmcache is). Fix: in its pyproject.toml write dependencies = "
        f'["{core_requirement()}"] instead of "{UPSTREAM_DISTRIBUTION}", rebuild and '
        "reinstall the wheel"
    )


def _upstream_metadata_present() -> bool:
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip file, a missing folder
            continue
        if any(_UPSTREAM_METADATA.match(name) for name in names):
            return True
    return False


def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (None when it is not installed)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def upstream_conflict() -> str | None:
    """One line when upstream's ``lmcache`` distribution is installed over or beside this
    core (its files own ``lmcache/__init__.py``, or both distributions are installed)."""
    if not _upstream_metadata_present():
        return None
    import importlib.metadata

    try:
        upstream = importlib.metadata.distribution(UPSTREAM_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    owns_package = any(str(f).replace("\\", "/") == _PACKAGE_INIT for f in upstream.files or [])
    core_version = installed_version(CORE_DISTRIBUTION)
    if not owns_package and core_version is None:
        return None
    beside = f" beside {CORE_DISTRIBUTION} {core_version}" if core_version else ""
    return (
        f"upstream LMCache's distribution {UPSTREAM_DISTRIBUTION} {upstream.version} is "
        f"installed{beside}; both install the import package 'lmcache', so one overwrites "
        f"the other's files. Fix: {reinstall_fix()}"
    )


def warn_if_upstream_installed() -> None:
    """Log :func:`upstream_conflict` once, at ``import lmcache``; never raises."""
    try:
        conflict = upstream_conflict()
    except Exception:  # a broken metadata folder must not break the import
        logger.debug("checking for upstream's lmcache distribution failed", exc_info=True)
        return
    if conflict is not None:
        logger.warning("%s", conflict)
