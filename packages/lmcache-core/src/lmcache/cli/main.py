"""Entry point of the ``lmcache`` command line.

Sub-commands live one per module in :mod:`lmcache.cli.commands`; each module exposes
``register(subparsers)`` which adds its parser and sets ``func`` (``args -> int``) as the
parser default.  Discovering them keeps this file closed to edits when a command is added.

Every failure ends the same way: one line ``lmcache <command>: error: <message>`` on
stderr and exit status 1 (bad and unknown flags included, named by the command they were
given to); the traceback is logged only at ``--log-level DEBUG``.  Ctrl-C exits 130
without a traceback.  A bare ``lmcache`` (or ``lmcache bench``) asks for the command list:
it prints the help on stdout and exits 0, as ``--help`` does.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from lmcache.cli import commands
from lmcache.logging import init_logger
from lmcache.v1.multiprocess.server_config import log_level

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
_PROG_ATTR = "_command_prog"


class CLIParser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block) and exit status 1."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_ERROR)


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every discovered sub-command."""
    parser = CLIParser(
        prog="lmcache",
        description="KV-cache offloading and sharing for LLM inference servers.",
    )
    parser.add_argument(
        "--log-level",
        type=log_level,
        default=None,
        help="Log level (DEBUG, INFO, WARNING, ERROR, CRITICAL); default from "
        "LMCACHE_LOG_LEVEL or INFO. DEBUG also prints the traceback of an error.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if module_info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{commands.__name__}.{module_info.name}")
        except Exception as exc:
            # One broken command (say, a missing optional dependency) must not take the
            # others down; the error surfaces when that command is run.
            _register_broken_command(subparsers, module_info.name, exc)
            continue
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    _remember_prog(parser)
    return parser


def _remember_prog(parser: argparse.ArgumentParser) -> None:
    """Each (sub-)command's parser knows its full name, for the error line."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(**{_PROG_ATTR: sub.prog})
                _remember_prog(sub)


def _register_broken_command(subparsers: Any, name: str, exc: Exception) -> None:
    reason = f"{type(exc).__name__}: {exc}"
    parser = subparsers.add_parser(name, help=f"(unavailable: {reason})", add_help=False)
    parser.add_argument("rest", nargs=argparse.REMAINDER)

    def run(_args: argparse.Namespace) -> int:
        logger.error("lmcache %s is unavailable: %s", name, reason)
        return 1

    parser.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    prog = getattr(args, _PROG_ATTR, parser.prog)
    if unknown:
        # argparse would report these under the top-level "lmcache:" prefix, whichever
        # command they were given to.
        sys.stderr.write(f"{prog}: error: unrecognized arguments: {' '.join(unknown)}\n")
        raise SystemExit(EXIT_ERROR)
    try:
        init_logger(args.log_level)
    except ValueError as exc:  # a bad LMCACHE_LOG_LEVEL in the environment
        return _fail(prog, exc)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_OK
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except SystemExit:
        raise
    except Exception as exc:
        return _fail(prog, exc)


def _fail(prog: str, exc: BaseException) -> int:
    if logging.getLogger("lmcache").isEnabledFor(logging.DEBUG):
        traceback.print_exception(exc, file=sys.stderr)
    message = " ".join(str(exc).split()) or type(exc).__name__
    sys.stderr.write(f"{prog}: error: {message}\n")
    return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
