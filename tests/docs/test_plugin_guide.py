"""Every shell command of docs/plugin-guide.md's vendor walk-through runs, in order, in a
temporary folder: scaffold, build, install (into a fresh venv), check, select, certify,
demo through a server, and the standalone conformance command.

Deliberate differences from a vendor's shell, all mechanical: the Prerequisites block is
checked (torch pin, extra name) but not run, since the test environment already has torch
and lmcache-core and may be offline; for the same reason ``pip wheel`` gets
``--no-build-isolation``; ``python`` is the fresh venv's interpreter and ``lmcache`` /
``pytest`` run as ``python -m lmcache.cli.main`` / ``python -m pytest`` (the venv has no
console scripts of a source checkout).  A guide edit that adds a command this test does not
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


def _argv(command: str, python: Path) -> list[str]:
    words = shlex.split(command)
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
    raise AssertionError(f"the guide has a command this test cannot run: {command!r}")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SELECTION_VARS}
    return {**env, "LMCACHE_TESTING_EXAMPLES": "10"}


def test_prerequisites_block_pins_torch_and_names_the_testing_extra() -> None:
    (block,) = _bash_blocks("Prerequisites")
    assert block[0].startswith("pip install torch==2.13.0 ")
    assert block[1] == 'pip install "lmcache-core[testing]"'


@pytest.mark.scaffold
@pytest.mark.timeout(1200)  # two conformance runs, a wheel build and a server round trip
def test_walkthrough_commands_run_in_a_fresh_folder(tmp_path: Path) -> None:
    require_module("setuptools", "builds the scaffolded wheel")
    # The walk-through, then the standalone certification block of its sub-section.
    walkthrough, certify = _bash_blocks("From nothing to a certified backend")
    assert certify == ["pytest --pyargs lmcache.testing --lmcache-backend acme"]
    python = _venv(tmp_path)
    cwd, outputs = tmp_path, {}
    for command in walkthrough + certify:
        if command.startswith("cd "):
            cwd = cwd / command[3:]
            continue
        proc = subprocess.run(_argv(command, python), cwd=cwd, env=_env(), capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        outputs[" ".join(command.split()[:2])] = proc.stdout
    check = outputs["lmcache plugin"]
    assert "acme = lmcache_acme.device:AcmeDeviceSpec (lmcache-acme 0.1.0): ok" in check
    assert "Selected: acme (device_type=cpu)" in outputs["lmcache devices"]
    assert "[FAIL]" not in outputs["lmcache demo"] and "bit-exact" in outputs["lmcache demo"]
    assert re.search(r"\b[1-9]\d* passed", outputs["pytest tests"])
    assert re.search(r"\b[1-9]\d* passed", outputs["pytest --pyargs"])
