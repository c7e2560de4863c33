"""The one recipe for SGLang 0.5.23 on CPU beside lmcache-core (used by the ``sglang-cpu``
nox session and by hand).

SGLang's metadata pins CUDA wheels (``torch==2.14.1``, ``sglang-kernel`` with sm90/sm100
binaries only, ``torchvision``); resolving it pulls gigabytes a CPU run never touches.
So: the CPU torch from the root pyproject's ``torch`` group, then every wheel of
``requirements-cpu.txt`` with ``--no-deps`` (pip resolves nothing), then lmcache-core.
``sgl_kernel`` and ``torchvision`` are import stubs (``stubs/sitecustomize.py``), active
for every process that has :func:`sglang_env`'s ``PYTHONPATH``.

By hand::

    python e2e/sglang/install.py /work/venvs/sglang            # core from this checkout
    python e2e/sglang/install.py VENV --core dist/lmcache_core-*.whl
    PYTHONPATH=e2e/sglang/stubs SGLANG_USE_CPU_ENGINE=1 VENV/bin/python -m sglang.launch_server ...
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REQUIREMENTS = HERE / "requirements-cpu.txt"
STUBS = HERE / "stubs"


def torch_pin() -> str:
    """The project's one torch pin (``[dependency-groups].torch``)."""
    with open(ROOT / "pyproject.toml", "rb") as handle:
        (pin,) = tomllib.load(handle)["dependency-groups"]["torch"]
    return str(pin)


def pip_steps(core: str | None = None) -> list[list[str]]:
    """The ``pip install`` argument lists, in order; ``core`` is a built lmcache-core wheel
    (None: this checkout's source tree)."""
    core_path = core or str(ROOT / "packages" / "lmcache-core")
    return [
        ["install", torch_pin()],
        ["install", "--no-deps", "-r", str(REQUIREMENTS)],
        ["install", "--no-deps", "--force-reinstall", core_path],
        # Everything lmcache-core asks for is pinned above: this only checks it is there.
        ["install", core_path],
    ]


def sglang_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for SGLang processes: the stubs on PYTHONPATH (inherited by the
    scheduler processes SGLang spawns) and SGLang's CPU engine."""
    env = dict(os.environ if base is None else base)
    paths = [str(STUBS), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    return env


def install(run_pip: Callable[[Sequence[str]], object], core: str | None = None) -> None:
    """Run every step through ``run_pip`` (a nox session's or a venv's pip)."""
    for step in pip_steps(core):
        run_pip(step)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("venv", type=Path, help="virtual environment to create or update")
    parser.add_argument("--core", help="lmcache-core wheel (default: this checkout's source)")
    args = parser.parse_args(argv)
    python = args.venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(args.venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "pip>=25.1"], check=True)

    def run_pip(step: Sequence[str]) -> None:
        subprocess.run([str(python), "-m", "pip", *step], check=True)

    install(run_pip, args.core)
    print(f"SGLang CPU environment ready: {args.venv}")
    print(f"  PYTHONPATH={STUBS} SGLANG_USE_CPU_ENGINE=1 {python} -m sglang.launch_server ...")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
