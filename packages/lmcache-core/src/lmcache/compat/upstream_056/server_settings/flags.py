"""Upstream 0.5.6's ``lmcache server`` flags for features this server lacks.

They parse as upstream's do, so upstream command lines and ``--config`` files start this
server unchanged; :mod:`.ignored` reports what they ask for.
"""

from __future__ import annotations

import argparse

TRANSPORTS = ("zmq", "grpc")
ENGINE_TYPES = ("default", "blend")


def add_upstream_server_args(parser: argparse.ArgumentParser) -> None:
    """Upstream's server flags for features this server lacks: parsed, checked, and
    reported at start-up (:mod:`.ignored`) instead of silently dropped."""
    group = parser.add_argument_group(
        "Upstream features this server lacks",
        "Accepted so upstream command lines parse; a value that would turn the feature on "
        "is logged as ignored at start-up (--transport grpc is refused).",
    )
    group.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="zmq",
        help="Request transport; this server speaks ZMQ only, so grpc is refused.",
    )
    group.add_argument(
        "--grpc-server-workers",
        type=int,
        default=32,
        help="gRPC dispatch threads (>= 1; used by --transport grpc only).",
    )
    group.add_argument(
        "--null-block-id",
        type=int,
        default=0,
        help="Engine block id meaning 'no KV data' (upstream skips storing chunks made only "
        "of it, for hybrid models); not used here.",
    )
    group.add_argument(
        "--engine-type",
        choices=ENGINE_TYPES,
        default="default",
        help="default (prefix caching) or blend (CacheBlend, not available here).",
    )
    group.add_argument(
        "--isolated-ipc",
        action="boolean_optional",
        default=False,
        help="IPC that works across containers without a shared IPC namespace (not "
        "available here; must match the workers' lmcache.mp.isolated_ipc upstream).",
    )
    group.add_argument(
        "--server-module",
        action="append",
        default=[],
        metavar="JSON",
        help='Out-of-tree server-module factory, \'{"module_path": ..., "factory_name": ..., '
        '"config": {...}}\' (repeatable); checked, but not loaded here.',
    )
