"""The commands of docs/sglang.md, as the e2e run and the docs test use them.

Every ``bash`` block of the page is one command; each is matched to one kind below
(an unknown command is an error, so a doc edit cannot add a command nothing runs).
Placeholders (``MODEL``, ``PROMPT``) and the ports are filled in by the caller.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "sglang.md"
KINDS = ("server", "sglang", "generate", "metrics", "install")


@dataclasses.dataclass(frozen=True)
class DocCommands:
    server: list[str]  # argv after ``lmcache``
    sglang_env: dict[str, str]  # the VAR=value prefix of the launch command
    sglang: list[str]  # argv after ``python``
    generate: str  # the curl command line
    metrics: str  # the curl | grep pipeline
    install: list[str]  # argv after ``python``
    config_yaml: str


def _kind(command: str) -> str:
    if command.startswith("lmcache server"):
        return "server"
    if "sglang.launch_server" in command:
        return "sglang"
    if command.startswith("curl") and "/generate" in command:
        return "generate"
    if command.startswith("curl") and "/metrics" in command:
        return "metrics"
    if command.startswith("python e2e/sglang/install.py"):
        return "install"
    raise ValueError(f"docs/sglang.md has a command no test runs: {command!r}")


def load(doc: Path = DOC) -> DocCommands:
    text = doc.read_text()
    found: dict[str, str] = {}
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        command = " ".join(line.rstrip("\\").strip() for line in block.strip().splitlines())
        kind = _kind(command)
        if kind in found:
            raise ValueError(f"docs/sglang.md has two {kind} commands")
        found[kind] = command
    missing = [k for k in KINDS if k not in found]
    if missing:
        raise ValueError(f"docs/sglang.md lacks the {missing} command(s)")
    yamls = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    if len(yamls) != 1:
        raise ValueError("docs/sglang.md must hold exactly one yaml block (cfg.yaml)")
    launch = shlex.split(found["sglang"])
    env = {}
    while launch and "=" in launch[0] and not launch[0].startswith("-"):
        name, value = launch.pop(0).split("=", 1)
        env[name] = value
    if launch[:1] != ["python"]:
        raise ValueError("the SGLang command must run `python -m sglang.launch_server`")
    return DocCommands(
        server=shlex.split(found["server"])[1:],
        sglang_env=env,
        sglang=launch[1:],
        generate=found["generate"],
        metrics=found["metrics"],
        install=shlex.split(found["install"])[1:],
        config_yaml=yamls[0],
    )


def with_option(argv: list[str], flag: str, value: str | None) -> list[str]:
    """``argv`` with ``flag``'s value replaced (``value`` None: the flag and its value
    removed); raises when the flag is absent."""
    if flag not in argv:
        raise ValueError(f"{flag} is not in {argv}")
    i = argv.index(flag)
    if value is None:
        return argv[:i] + argv[i + 2 :]
    return [*argv[: i + 1], value, *argv[i + 2 :]]


def without_flag(argv: list[str], flag: str) -> list[str]:
    if flag not in argv:
        raise ValueError(f"{flag} is not in {argv}")
    return [a for a in argv if a != flag]
