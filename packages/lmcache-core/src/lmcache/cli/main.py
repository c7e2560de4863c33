"""Entry point of the ``lmcache`` command line.

Sub-commands live one per module in :mod:`lmcache.cli.commands`; each module exposes
``register(subparsers)`` which adds its parser and sets ``func`` (``args -> int``) as the
parser default.  Discovering them keeps this file closed to edits when a command is added.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any

from lmcache.cli import commands
from lmcache.logging import init_logger

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every discovered sub-command."""
    parser = argparse.ArgumentParser(
        prog="lmcache",
        description="KV-cache offloading and sharing for LLM inference servers.",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        help="Log level (DEBUG, INFO, WARNING, ...); default from LMCACHE_LOG_LEVEL or INFO.",
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
    return parser


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
    args = parser.parse_args(argv)
    init_logger(args.log_level)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
