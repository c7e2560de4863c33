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
