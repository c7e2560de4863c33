"""docs/sglang.md's commands are the ones the ``sglang-cpu`` session runs.

``e2e/sglang/doc_commands.py`` reads every ``bash`` block of the page and refuses a
command it does not know; ``e2e/sglang/run_e2e.py`` runs them (server, cfg.yaml, SGLang
launch, the curl request, the metrics pipeline) and the nox session runs the install
command.  Without SGLang, this checks what can be checked here: every block is known, the
server command and the YAML are valid for lmcache-core, and the SGLang command carries the
flags the integration needs.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from lmcache.cli.commands.server import resolve_config
from lmcache.cli.main import build_parser
from lmcache.v1.config import LMCacheEngineConfig

ROOT = Path(__file__).resolve().parents[2]


def _doc_commands() -> Any:
    name = "sglang_doc_commands"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "e2e" / "sglang" / "doc_commands.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclass resolves annotations through it
    spec.loader.exec_module(module)
    return module


def test_every_command_is_known_and_the_server_command_is_valid() -> None:
    commands = _doc_commands().load()
    config = resolve_config(build_parser().parse_args(commands.server))
    assert config.chunk_size % 16 == 0  # a multiple of the page size of the SGLang command


def test_yaml_is_a_valid_lmcache_config_with_the_server_port(tmp_path: Path) -> None:
    commands = _doc_commands().load()
    path = tmp_path / "cfg.yaml"
    path.write_text(commands.config_yaml)
    config = LMCacheEngineConfig.from_file(path, strict=True)
    server_port = commands.server[commands.server.index("--port") + 1]
    assert config.mp_host and str(config.mp_port) == server_port


def test_sglang_command_enables_lmcache_with_the_yaml() -> None:
    commands = _doc_commands().load()
    argv = commands.sglang
    assert argv[:2] == ["-m", "sglang.launch_server"]
    assert "--enable-lmcache" in argv
    assert argv[argv.index("--lmcache-config-file") + 1] == "cfg.yaml"
    page = int(argv[argv.index("--page-size") + 1])
    chunk = int(commands.server[commands.server.index("--chunk-size") + 1])
    assert chunk % page == 0
    assert (ROOT / commands.sglang_env["PYTHONPATH"] / "sitecustomize.py").is_file()
    assert commands.sglang_env["SGLANG_USE_CPU_ENGINE"] == "1"
    body = json.loads(shlex.split(commands.generate)[-1])
    assert body["sampling_params"]["temperature"] == 0  # greedy: comparable outputs
    assert (ROOT / commands.install[0]).is_file()


def test_a_command_nothing_runs_is_refused(tmp_path: Path) -> None:
    doc_commands = _doc_commands()
    doc = tmp_path / "sglang.md"
    doc.write_text(doc_commands.DOC.read_text() + "\n```bash\nrm -rf /tmp/x\n```\n")
    try:
        doc_commands.load(doc)
    except ValueError as exc:
        assert "no test runs" in str(exc)
    else:
        raise AssertionError("an unknown command was accepted")
