"""Upstream 0.5.6's server settings as a ``lmcache server`` extension.

Published by lmcache-core's own ``lmcache.server_extensions`` entry point, so the server
gains upstream's flags, its start-up report of ignored settings and upstream's
``/periodic-threads`` routes without importing this package
(:mod:`lmcache.v1.multiprocess.server.extensions`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from lmcache.compat.upstream_056.server_settings.coordinator import add_coordinator_args
from lmcache.compat.upstream_056.server_settings.flags import add_upstream_server_args
from lmcache.compat.upstream_056.server_settings.ignored import UpstreamSettings, check_supported
from lmcache.compat.upstream_056.server_settings.p2p import add_p2p_args


class UpstreamServerSettings:
    """The extension object (a ``ServerExtension``, see the module docstring)."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_upstream_server_args(parser)
        add_p2p_args(parser)
        add_coordinator_args(parser)

    def check(self, args: argparse.Namespace) -> list[str]:
        return check_supported(UpstreamSettings.from_args(args))

    def http_routers(self) -> Sequence[Any]:
        from lmcache.compat.upstream_056.http_apis.periodic_thread_api import router

        return [router]


EXTENSION = UpstreamServerSettings()
