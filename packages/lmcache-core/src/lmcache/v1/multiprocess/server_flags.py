"""The ``lmcache server`` flags (upstream names where they exist), by group."""

from __future__ import annotations

import argparse

from lmcache.v1.config import CACHE_POLICIES
from lmcache.v1.multiprocess.config_file import track_explicit_flags
from lmcache.v1.multiprocess.flag_types import (
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    tcp_port,
    tcp_port_or_off,
    upper_case,
    usable_directory,
)
from lmcache.v1.multiprocess.runtime_plugin_config import add_runtime_plugin_args
from lmcache.v1.multiprocess.wire.protocol import DEFAULT_MAX_MESSAGE_BYTES
from lmcache.v1.platform.transfer_mode import MPTransferMode

AUTO_SHM = "auto"
TRANSPORTS = ("zmq", "grpc")
ENGINE_TYPES = ("default", "blend")


def add_mp_server_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    track_explicit_flags(parser)
    group = parser.add_argument_group("MP server")
    group.add_argument("--host", default="127.0.0.1", help="Bind address (default 127.0.0.1).")
    group.add_argument("--port", type=tcp_port, default=5555, help="ZMQ port (default 5555).")
    group.add_argument(
        "--instance-id",
        default=None,
        help="Server id, shown in the start-up line, the log and /status (default: a random "
        "uuid4 at start-up, as upstream).",
    )
    group.add_argument(
        "--chunk-size",
        type=positive_int,
        default=256,
        help="Tokens per chunk (> 0; a worker's block size must divide it).",
    )
    group.add_argument(
        "--max-workers",
        type=positive_int,
        default=None,
        help="Handler threads per pool (default: min(4, CPUs); upstream default 1).",
    )
    group.add_argument(
        "--max-gpu-workers", type=positive_int, default=None, help="Transfer pool size."
    )
    group.add_argument(
        "--max-cpu-workers", type=positive_int, default=None, help="Lookup pool size."
    )
    group.add_argument(
        "--supported-transfer-mode",
        choices=[m.value for m in MPTransferMode],
        default=MPTransferMode.AUTO.value,
        help="Transfer modes served: lmcache_driven (store/retrieve into registered KV "
        "caches), engine_driven (prepare/commit), auto (both). Default auto, so the default "
        "worker and vLLM's auto mode are served (upstream's default is lmcache_driven).",
    )
    group.add_argument(
        "--shm-name",
        default=AUTO_SHM,
        help="POSIX shared-memory name of L1, shared with engine-driven workers (SHM "
        "sub-path). Default 'auto' (a fresh name); '' disables SHM (inline sub-path only).",
    )
    group.add_argument(
        "--worker-reap-timeout-seconds",
        type=non_negative_float,
        default=120.0,
        help="Forget a worker (and release its shared memory) after this long without "
        "contact; 0 disables.",
    )
    group.add_argument(
        "--session-ttl-seconds",
        type=positive_float,
        default=600.0,
        help="Unpin the chunks of a lookup never followed by a retrieve after this long.",
    )
    group.add_argument(
        "--pending-transfer-timeout-seconds",
        type=positive_float,
        default=60.0,
        help="Free prepared-but-uncommitted engine-driven transfers after this long.",
    )
    group.add_argument(
        "--max-message-mb",
        type=positive_float,
        default=DEFAULT_MAX_MESSAGE_BYTES / 1024**2,
        help="Largest request accepted (MiB); larger ones get a message_too_large error.",
    )
    storage = parser.add_argument_group("Storage")
    storage.add_argument(
        "--l1-size-gb",
        type=positive_float,
        default=None,
        help="L1 (host memory) size in GiB; default min(1, 1/4 of available memory).",
    )
    storage.add_argument(
        "--eviction-policy",
        choices=list(CACHE_POLICIES),
        default="LRU",
        type=upper_case,
        help="L1 eviction policy (default LRU).",
    )
    storage.add_argument(
        "--l2-disk-path",
        type=usable_directory,
        default=None,
        help="Directory of the disk tier (L2); must be a writable directory or creatable.",
    )
    storage.add_argument(
        "--l2-disk-size-gb",
        type=non_negative_float,
        default=0.0,
        help="Disk tier size (GiB); the tier is on when this and --l2-disk-path are set.",
    )
    storage.add_argument(
        "--l2-disk-adopt",
        action="store_true",
        help="Use a disk tier folder that holds files the tier did not write; they are left "
        "untouched (without it such a folder is refused).",
    )
    storage.add_argument(
        "--l2-prefetch-max-in-flight",
        type=non_negative_int,
        default=8,
        help="Lower-tier chunks read into L1 at once in the background after a lookup (as "
        "upstream; default 8); 0 = no prefetch: a retrieve reads the lower tiers itself.",
    )
    storage.add_argument(
        "--kv-event-log-size",
        type=non_negative_int,
        default=32768,
        help="KV-event records (CPU-tier stores and removals) kept per model for "
        "subscribe_kv_events subscribers (as upstream; default 32768); 0 turns them off.",
    )
    storage.add_argument(
        "--l2-prefetch-wait-timeout-seconds",
        type=positive_float,
        default=30.0,
        help="How long a retrieve waits for the prefetch of a chunk it needs; then it is a miss.",
    )
    storage.add_argument(
        "--l2-adapter",
        action="append",
        default=[],
        metavar="JSON",
        help=(
            "Add an L2 tier (repeatable), upstream's JSON form: "
            '\'{"type": "resp", "url": "redis://127.0.0.1:6379"}\' (also "redis", "valkey") '
            'or \'{"type": "disk", "path": "/data", "size_gb": 10}\' (also "fs").'
        ),
    )
    add_upstream_server_args(parser)
    add_runtime_plugin_args(parser)
    add_admin_args(parser)
    add_http_frontend_args(parser)
    add_observability_args(parser)
    return parser


def add_upstream_server_args(parser: argparse.ArgumentParser) -> None:
    """Upstream's server flags for features this server lacks: parsed, checked, and
    reported at start-up (``server.unsupported``) instead of silently dropped."""
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


def add_admin_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Admin operations", "See the threat model in docs/operations.md."
    )
    group.add_argument(
        "--enable-admin-ops",
        action="store_true",
        help="Serve admin operations on the ZMQ port (clear: drops every worker's cached "
        "objects). Off by default: they are refused with a 'forbidden' error.",
    )
    group.add_argument(
        "--admin-token-file",
        default=None,
        metavar="PATH",
        help="File holding the admin token (e.g. a mounted Kubernetes Secret; surrounding "
        "whitespace is ignored). Admin requests, on the ZMQ port and POST /cache/clear, must "
        "then present it. At least 16 printable ASCII characters.",
    )
    group.add_argument(
        "--admin-token",
        default=None,
        metavar="TOKEN",
        help="The admin token itself (visible in the process list: prefer --admin-token-file "
        "or the LMCACHE_ADMIN_TOKEN environment variable, used when neither flag is given).",
    )


def add_http_frontend_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("HTTP frontend")
    group.add_argument(
        "--http-host", default="127.0.0.1", help="Bind address of the HTTP frontend."
    )
    group.add_argument(
        "--http-port",
        type=tcp_port_or_off,
        default=8080,
        help="Port of the HTTP frontend (/healthcheck, /status, /metrics, /cache/clear); "
        "0 disables it.",
    )
    group.add_argument(
        "--enable-http-cache-clear",
        action="store_true",
        help="Serve POST /cache/clear (off by default: it drops every cached object). With an "
        "admin token configured, the request must carry 'Authorization: Bearer TOKEN'.",
    )
    group.add_argument(
        "--run-script-api-enabled",
        action="boolean_optional",
        default=False,
        help="Serve POST /run_script, which runs an uploaded Python script inside the server "
        "(off by default; enable only where every caller is trusted). With an admin token "
        "configured, the request must carry it.",
    )
    group.add_argument(
        "--script-allowed-imports",
        nargs="*",
        default=[],
        metavar="MODULE",
        help="Modules a /run_script script may import (none by default).",
    )


def add_observability_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Observability")
    group.add_argument(
        "--disable-metrics",
        action="store_true",
        help="Keep no Prometheus metrics (no hot-path cost; /metrics answers 404).",
    )
    group.add_argument(
        "--prometheus-port",
        type=tcp_port_or_off,
        default=9090,
        help="Also serve /metrics on this port (on --http-host); 0 disables it.",
    )
