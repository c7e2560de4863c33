"""``lmcache server``: run the MP cache server (ZMQ, default tcp://127.0.0.1:5555).

With no flags it serves on the embedded defaults: a bounded L1 of min(1 GiB, a quarter of
available memory) with LRU eviction, in POSIX shared memory (so engine-driven workers use
the SHM sub-path), and both transfer modes (``auto``).  An HTTP frontend on
127.0.0.1:8080 answers /healthcheck, /status and /metrics (Prometheus; also on
--prometheus-port 9090); ``--http-port 0`` and ``--prometheus-port 0`` turn them off.
SIGINT/SIGTERM shut it down cleanly: in-flight requests are answered, the disk tier is
flushed and the shared memory it created is removed.  Upstream 0.5.6's flags for
features this server lacks (coordinator, P2P, CacheBlend, server modules) are accepted and
logged as ignored at start-up; ``--transport grpc`` is refused.
"""

from __future__ import annotations

import argparse
from typing import Any

from lmcache.v1.multiprocess.server.extensions import (
    add_extension_arguments,
    check_extension_settings,
)
from lmcache.v1.multiprocess.server_config import (
    MPServerConfig,
    add_mp_server_args,
    apply_config_file,
    config_from_args,
    load_config_file,
    log_level,
)

# Flags a config file may not set: they choose the file, or belong to the CLI itself.
_NOT_IN_CONFIG = frozenset({"config", "server_log_level"})


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "server", help="Launch the LMCache MP cache server.", description=__doc__
    )
    add_mp_server_args(parser)
    # Server extensions' flags (lmcache-core's own: upstream's settings for features this
    # server lacks, accepted and logged as ignored).
    add_extension_arguments(parser)
    parser.add_argument(
        "--config",
        default=None,
        help="YAML or JSON file of flag values (keys are flag names, dashes or underscores), "
        "checked like the flags; flags given on the command line win.",
    )
    parser.add_argument(
        "--log-level",
        dest="server_log_level",
        type=log_level,
        default=None,
        help="Log level of the server (DEBUG, INFO, WARNING, ERROR, CRITICAL).",
    )
    parser.set_defaults(func=run, _server_parser=parser)


def resolve_config(args: argparse.Namespace) -> MPServerConfig:
    """Defaults < ``--config`` file < flags given on the command line; all validated."""
    if args.config:
        values = load_config_file(args.config)
        apply_config_file(
            args._server_parser, args, values, f"--config {args.config}", ignore=_NOT_IN_CONFIG
        )
    return config_from_args(args).validate()


def run(args: argparse.Namespace) -> int:
    from lmcache.logging import init_logger
    from lmcache.v1.multiprocess.server.run import run_server
    from lmcache.v1.multiprocess.server.transport import MPServer

    if args.server_log_level:
        init_logger(args.server_log_level)
    config = resolve_config(args)
    check_extension_settings(args)

    def announce(server: MPServer) -> None:
        stats = server.engine.get_stats()
        shm = stats.shm_name or "off (inline sub-path only)"
        print(
            f"LMCache server {server.config.instance_id} listening on {server.endpoint} | "
            f"chunk size {config.chunk_size} | "
            f"L1 {stats.l1_capacity_bytes / 1024**3:.2f} GiB {config.eviction_policy} | "
            f"SHM {shm} | transfer mode {config.supported_transfer_mode.value} | "
            f"HTTP {server.http_url or 'off'} | "
            f"metrics {'off' if config.disable_metrics else 'on'}",
            flush=True,
        )

    return run_server(config, ready=announce)
