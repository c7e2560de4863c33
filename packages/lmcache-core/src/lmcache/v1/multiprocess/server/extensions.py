"""Server extensions: extra flags, start-up checks and HTTP routes, found by entry point.

An extension is an object published in the ``lmcache.server_extensions`` entry-point group
(lmcache-core itself publishes one: upstream 0.5.6's settings for features this server
lacks).  ``lmcache server`` adds each extension's flags to its parser, lets it check the
parsed values before anything is allocated (a ``ValueError`` refuses the start, any
returned line is logged as a warning), and mounts its HTTP routers on the frontend.  The
server never imports an extension's module by name: the dependency points from the
extension to the server.

An extension that fails to load is logged and left out, as a broken device plugin is.
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol

logger = logging.getLogger(__name__)

SERVER_EXTENSION_ENTRY_POINT_GROUP = "lmcache.server_extensions"


class ServerExtension(Protocol):
    """What an entry point of :data:`SERVER_EXTENSION_ENTRY_POINT_GROUP` must provide."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this extension's flags (argument groups) to ``lmcache server``'s parser."""

    def check(self, args: argparse.Namespace) -> list[str]:
        """Check the parsed flags: raise ``ValueError`` to refuse the start; return the
        settings that are accepted but have no effect (each is logged as a warning)."""

    def http_routers(self) -> Sequence[Any]:
        """FastAPI routers to mount on the HTTP frontend (may be empty)."""


@functools.cache
def server_extensions() -> tuple[ServerExtension, ...]:
    """Every installed extension, by entry-point name (loaded once per process)."""
    loaded: list[ServerExtension] = []
    for entry in sorted(entry_points(group=SERVER_EXTENSION_ENTRY_POINT_GROUP), key=_name):
        try:
            loaded.append(entry.load())
        except Exception as exc:  # a broken extension must not stop the server
            logger.warning(
                "server extension %r (%s) not loaded: %s: %s",
                entry.name,
                entry.value,
                type(exc).__name__,
                exc,
            )
    return tuple(loaded)


def _name(entry: Any) -> str:
    return str(entry.name)


def add_extension_arguments(parser: argparse.ArgumentParser) -> None:
    for extension in server_extensions():
        extension.add_arguments(parser)


def check_extension_settings(args: argparse.Namespace) -> None:
    """Run every extension's check; log what is accepted but ignored."""
    for extension in server_extensions():
        for setting in extension.check(args):
            logger.warning("ignored, this server does not implement it: %s", setting)


def extension_http_routers() -> list[Any]:
    return [router for extension in server_extensions() for router in extension.http_routers()]
