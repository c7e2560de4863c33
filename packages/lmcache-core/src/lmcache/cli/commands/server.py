"""``lmcache server``: run the MP cache server (ZMQ, default tcp://127.0.0.1:5555).

With no flags it serves on the embedded defaults: a bounded L1 of min(1 GiB, a quarter of
available memory) with LRU eviction, in POSIX shared memory (so engine-driven workers use
the SHM sub-path), and the lmcache_driven transfer mode.  An HTTP frontend on
127.0.0.1:8080 answers /healthcheck, /status and /metrics (Prometheus; also on
--prometheus-port 9090); ``--http-port 0`` and ``--prometheus-port 0`` turn them off.
SIGINT/SIGTERM shut it down cleanly: in-flight requests are answered, the disk tier is
flushed and the shared memory it created is removed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lmcache.v1.multiprocess.config import add_mp_server_args, config_from_args


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "server", help="Launch the LMCache MP cache server.", description=__doc__
    )
    add_mp_server_args(parser)
    parser.add_argument(
        "--config",
        default=None,
        help="YAML or JSON file of flag values (keys are flag names, dashes or underscores); "
        "flags given on the command line win.",
    )
    parser.add_argument(
        "--log-level",
        dest="server_log_level",
        default=None,
        help="Log level of the server (DEBUG, INFO, ...).",
    )
    parser.set_defaults(func=run, _server_parser=parser)


def _load_config_file(path: str) -> dict[str, Any]:
    text = Path(path).read_text()
    if path.endswith(".json"):
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of flag names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def run(args: argparse.Namespace) -> int:
    from lmcache.logging import init_logger
    from lmcache.v1.multiprocess.server import MPServer, run_server

    if args.config:
        parser: argparse.ArgumentParser = args._server_parser
        known = {a.dest for a in parser._actions}
        values = _load_config_file(args.config)
        unknown = sorted(set(values) - known)
        if unknown:
            print(f"lmcache server: unknown keys in {args.config}: {', '.join(unknown)}")
            return 2
        defaults = {a.dest: a.default for a in parser._actions}
        for name, value in values.items():
            if getattr(args, name) == defaults.get(name):
                setattr(args, name, value)
    if args.server_log_level:
        init_logger(args.server_log_level)
    config = config_from_args(args)

    def announce(server: MPServer) -> None:
        stats = server.engine.get_stats()
        shm = stats.shm_name or "off (inline sub-path only)"
        print(
            f"LMCache server listening on {server.endpoint} | chunk size {config.chunk_size} | "
            f"L1 {stats.l1_capacity_bytes / 1024**3:.2f} GiB {config.eviction_policy} | "
            f"SHM {shm} | transfer mode {config.supported_transfer_mode.value} | "
            f"HTTP {server.http_url or 'off'} | "
            f"metrics {'off' if config.disable_metrics else 'on'}",
            flush=True,
        )

    return run_server(config, ready=announce)
