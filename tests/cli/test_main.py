"""``lmcache`` top level: one error line and exit 1, traceback only at DEBUG, Ctrl-C 130."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmcache.cli import main as cli_main
from lmcache.cli.commands import server as server_command


@pytest.fixture(autouse=True)
def _restore_lmcache_logger() -> Iterator[None]:
    root = logging.getLogger("lmcache")
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def _raise(exc: BaseException) -> object:
    def run(_args: argparse.Namespace) -> int:
        raise exc

    return run


def test_exception_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(server_command, "run", _raise(RuntimeError("disk\nfull")))
    assert cli_main.main(["--log-level", "INFO", "server"]) == 1
    err = capsys.readouterr().err
    assert err == "lmcache server: error: disk full\n"


def test_debug_prints_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(server_command, "run", _raise(RuntimeError("boom")))
    assert cli_main.main(["--log-level", "DEBUG", "server"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.rstrip().endswith("lmcache server: error: boom")


def test_keyboard_interrupt_exits_130_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(server_command, "run", _raise(KeyboardInterrupt()))
    assert cli_main.main(["server"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_bad_flag_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["server", "--port", "99999"])
    assert exited.value.code == 1
    assert capsys.readouterr().err == (
        "lmcache server: error: argument --port: 99999 is not a TCP port (1-65535)\n"
    )


def test_bad_log_level_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["--log-level", "verbose", "devices"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("lmcache: error: argument --log-level: unknown log level 'verbose'")
    assert "DEBUG, INFO, WARNING, ERROR, CRITICAL" in err


def test_bad_log_level_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("LMCACHE_LOG_LEVEL", "verbose")
    assert cli_main.main(["server", "--config", str(tmp_path / "x.yaml")]) == 1
    assert capsys.readouterr().err.startswith("lmcache server: error: unknown log level")


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["server", "--no-such-flag"], "lmcache server"),
        (["plugin", "check", "--no-such-flag"], "lmcache plugin check"),
        (["bench", "ops", "--no-such-flag"], "lmcache bench ops"),
    ],
)
def test_unknown_flag_is_reported_by_its_command(
    capsys: pytest.CaptureFixture[str], argv: list[str], prog: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(argv)
    assert exited.value.code == 1
    assert capsys.readouterr().err == f"{prog}: error: unrecognized arguments: --no-such-flag\n"


@pytest.mark.parametrize("argv", [[], ["bench"]])
def test_bare_command_prints_help_and_exits_0(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert cli_main.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"usage: {' '.join(['lmcache', *argv])} ")
    assert captured.err == ""


def _parsers(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser, dict[str, str | None]]]:
    """Every (sub-)command parser with the help its parent lists for each of its children."""
    children: dict[str, str | None] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                children[name] = listed.get(name)
                yield from _parsers(sub, f"{path} {name}")
    yield path, parser, children


def test_every_command_and_flag_has_help() -> None:
    missing = []
    for path, parser, children in _parsers(cli_main.build_parser(), "lmcache"):
        if not (parser.description or "").strip():
            missing.append(f"{path}: no description")
        missing.extend(f"{path} {name}: no help" for name, text in children.items() if not text)
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            # argparse.SUPPRESS hides deprecated spellings on purpose.
            if not (action.help or "").strip():
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}: no help")
    assert missing == []
