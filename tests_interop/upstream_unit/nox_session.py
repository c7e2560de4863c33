"""The body of the ``upstream-unit`` nox session (imported by ``noxfile.py``).

Upstream's unit tests ship only in its sdist (``pip download lmcache==0.5.6 --no-binary
:all:`` would also *build* it, compiling its C++ extensions and its build requirements from
source).  So the sdist file itself is fetched once through the simple index pip is
configured with (``PIP_INDEX_URL`` or ``pip config``, else pip's default; its PEP 691 JSON
form, as pip reads it), checked against the pinned sha256 (``run.SDIST_SHA256``) and
cached in ``.nox/_interop/``; later runs are offline.  Under nox a missing sdist (no
network) is a failure, not a skip.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PEP691_JSON = "application/vnd.pypi.simple.v1+json"
FETCH_TIMEOUT_S = 120


def _index_url() -> str:
    """The package index pip is configured with (``PIP_INDEX_URL``, then ``pip config``),
    else pip's own default: no index host is named here."""
    configured = os.environ.get("PIP_INDEX_URL", "").strip()
    if not configured:
        found = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
            capture_output=True,
            text=True,
            check=False,
        )
        configured = found.stdout.strip() if found.returncode == 0 else ""
    if not configured:
        from pip._internal.models.index import PyPI

        configured = PyPI.simple_url
    return configured.split()[0].rstrip("/")


def _sdist_url(name: str) -> str:
    project = f"{_index_url()}/lmcache/"
    request = urllib.request.Request(project, headers={"Accept": PEP691_JSON})
    with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:
        index = json.load(response)
    for entry in index["files"]:
        if entry["filename"] == name:
            return str(entry["url"])
    raise OSError(f"the index's page for lmcache ({project}) lists no {name}")


def ensure_sdist(session: Any, cache: Path, name: str, sha256: str) -> Path:
    """The cached sdist, downloaded (and hash-checked) on first use."""
    path = cache / name
    if path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    try:
        url = _sdist_url(name)
        session.log(f"fetching {url}")
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            data = response.read()
    except (OSError, ValueError, KeyError) as exc:  # no network, or an unexpected index
        session.error(
            f"cannot fetch {name} from the package index ({exc}); place it at {path} to run offline"
        )
    if hashlib.sha256(data).hexdigest() != sha256:
        session.error(f"{name} from the package index does not match the pinned sha256 {sha256}")
    partial = path.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(path)
    return path


def run(session: Any) -> None:
    """lmcache-core, the lmcache-cuda plugin and the ``upstream-unit`` dependency group (the
    test deps and ``blake3``) are already installed in ``session``'s venv."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("upstream_unit_run", HERE / "run.py")
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner  # dataclasses look their module up there
    spec.loader.exec_module(runner)
    sdist = ensure_sdist(
        session,
        ROOT / ".nox" / "_interop",
        runner.SDIST_NAME,
        runner.SDIST_SHA256,
    )
    session.chdir(str(ROOT))
    # --strict: any test that runs and fails or errors fails the session.
    session.run("python", str(HERE / "run.py"), "--sdist", str(sdist), "--strict", *session.posargs)
