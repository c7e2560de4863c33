"""Every shell command of docs/plugin-guide.md's vendor walk-through runs, in order, in a
temporary folder outside the checkout: scaffold, build, install (into a fresh venv), check
with its speed, devices, demo through a server on the new backend, the scaffold's own
``nox -s tests`` against a wheelhouse, and the standalone conformance command.

Deliberate differences from a vendor's shell, all mechanical: the Prerequisites block is
checked (torch pin, the wheelhouse variable, extra name) but not run, since the test
environment already has torch and lmcache-core and may be offline; for the same reason
``pip wheel`` gets ``--no-build-isolation``; ``python`` is the fresh venv's interpreter and
``lmcache`` / ``pytest`` run as ``python -m lmcache.cli.main`` / ``python -m pytest`` (the
venv has no console scripts of a source checkout).  ``nox -s tests`` is the scaffold's
noxfile unchanged, run with ``-r`` in a venv the test makes first (``.nox/tests``, seeing
this interpreter's packages *without* any lmcache: torch, pytest, setuptools need no
index), pip offline (``PIP_NO_INDEX``, no build isolation, no pip configuration):
lmcache-core can only come from ``LMCACHE_WHEELHOUSE``, a folder holding the wheel
``lmcache plugin wheelhouse`` wrote.  A guide edit that adds a command this test does not
know how to run fails it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from nocore import env_without_core, make_python_without_core
from prerequisites import require_module

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugin-guide.md"
_SELECTION_VARS = ("DEVICE_TYPE", "LMCACHE_DEVICE_BACKEND", "LMCACHE_TESTING_BACKEND")


def _bash_blocks(section: str) -> list[list[str]]:
    """The commands (comments stripped) of each ```bash block under ``## section``."""
    text = GUIDE.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else None]
    blocks = re.findall(r"```bash\n(.*?)```", body, flags=re.S)
    return [
        [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
        for block in blocks
    ]


def _venv(tmp: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                             check=True).stdout.strip()  # fmt: skip
    parent = sysconfig.get_paths()["purelib"]
    (Path(purelib) / "_parent_env.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    return python


def _assignments(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading ``VAR=value`` words (a command's own environment) and the rest."""
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def _argv(words: list[str], python: Path) -> list[str]:
    head, rest = words[0], words[1:]
    if head == "python":
        if rest[:3] == ["-m", "pip", "wheel"]:
            rest = [*rest[:3], "--no-build-isolation", *rest[3:]]
        return [str(python), *rest]
    if head == "lmcache":
        return [str(python), "-m", "lmcache.cli.main", *rest]
    if head == "pytest":
        # -p: a source checkout has no pytest11 entry point; an installed core does.
        return [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-p",
                "lmcache.testing.plugin", *rest]  # fmt: skip
    if head == "nox":
        return [sys.executable, "-m", "nox", "-r", *rest]
    raise AssertionError(f"the guide has a command this test cannot run: {words!r}")


def _nox_env(project: Path, wheelhouse: Path) -> dict[str, str]:
    """The scaffold's ``nox -s tests`` venv, made in advance without lmcache; pip offline."""
    make_python_without_core(project / ".nox" / "_deps", venv=project / ".nox" / "tests")
    return env_without_core({"LMCACHE_WHEELHOUSE": str(wheelhouse), "PIP_NO_BUILD_ISOLATION": "0",
                             "LMCACHE_TESTING_EXAMPLES": "10"})  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SELECTION_VARS}
    return {**env, "LMCACHE_TESTING_EXAMPLES": "10"}


def test_prerequisites_block_pins_torch_and_takes_the_core_from_the_wheelhouse() -> None:
    (block,) = _bash_blocks("Prerequisites")
    assert block[0].startswith("pip install torch==2.13.0 ")
    assert block[1].startswith("export LMCACHE_WHEELHOUSE=")
    assert block[2] == 'pip install --find-links "$LMCACHE_WHEELHOUSE" "lmcache-core[testing]"'


@pytest.mark.scaffold
@pytest.mark.timeout(1200)  # two conformance runs, two wheel builds and a server round trip
def test_walkthrough_commands_run_in_a_fresh_folder(tmp_path: Path, core_wheelhouse: Path) -> None:
    require_module("setuptools", "builds the scaffolded wheel")
    require_module("nox", "runs the scaffold's own nox -s tests")
    # The walk-through, then the standalone certification block of its sub-section.
    walkthrough, certify = _bash_blocks("From nothing to a certified backend")
    assert certify == ["pytest --pyargs lmcache.testing --lmcache-backend acme"]
    python = _venv(tmp_path)
    cwd, outputs = tmp_path, {}
    for command in walkthrough + certify:
        if command.startswith("cd "):
            cwd = cwd / command[3:]
            continue
        own_env, words = _assignments(shlex.split(command))
        env = {**_env(), **own_env}
        if words[0] == "nox":
            env = {**_nox_env(cwd, core_wheelhouse), **own_env}
        proc = subprocess.run(_argv(words, python), cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        outputs[" ".join(words[:2])] = proc.stdout + proc.stderr
    check = outputs["lmcache plugin"]
    assert "acme = lmcache_acme.device:AcmeDeviceSpec (lmcache-acme 0.1.0): ok" in check
    assert re.search(r"D2H  acme [\d.]+  torch baseline [\d.]+  ratio [\d.]+x", check), check
    assert "Selected: cpu (device_type=cpu)" in outputs["lmcache devices"]
    assert re.search(
        r"acme +device_type=cpu +available=True +priority=-1", outputs["lmcache devices"]
    )
    assert "[FAIL]" not in outputs["lmcache demo"] and "bit-exact" in outputs["lmcache demo"]
    assert "LMCache device backend 'acme' selected" in outputs["lmcache demo"]
    nox = outputs["nox -s"]
    assert f"--find-links {core_wheelhouse}" in nox and "Session tests was successful" in nox
    assert re.search(r"\b4 passed", nox), nox[-3000:]
    assert re.search(r"\b[1-9]\d* passed", outputs["pytest --pyargs"])
