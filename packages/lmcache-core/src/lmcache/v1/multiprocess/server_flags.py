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
from lmcache.v1.multiprocess.runtime_plugins.settings import add_runtime_plugin_args
from lmcache.v1.multiprocess.wire.protocol import (
    DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
)
from lmcache.v1.platform.transfer_mode import MPTransferMode

AUTO_SHM = "auto"
# The HTTP frontend's connection limits (lmcache.v1.multiprocess.server.http_limits).
DEFAULT_HTTP_HEADER_TIMEOUT_S = 10.0
DEFAULT_HTTP_BODY_TIMEOUT_S = 30.0
# Probes, Prometheus and a few operators need a handful; 128 stays far below the usual
# descriptor limit (1024 or more), which the ZMQ transport shares.
DEFAULT_HTTP_MAX_CONNECTIONS = 128


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
        help="Largest request accepted (MiB, all frames together); larger ones get a "
        "message_too_large error. The default (169) is the largest request a worker sends: "
        "an inline store of one 4 MiB chunk group plus one 128 MiB chunk (256 tokens of "
        "512 KiB per token and rank) and a key of the most tokens (4M x 9 bytes); raise it "
        "for larger chunks. libzmq holds up to twice this per peer while receiving.",
    )
    group.add_argument(
        "--max-inflight-mb",
        type=positive_float,
        default=DEFAULT_MAX_INFLIGHT_BYTES / 1024**2,
        help="Budget of request bytes read and not yet answered, across all peers (MiB, "
        "default 1024, at least --max-message-mb); a request past it gets a 'busy' error "
        "at once (retryable) and its memory is released. Requests of 64 KiB or less are "
        "exempt. See 'Request memory' in docs/operations.md.",
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
    add_runtime_plugin_args(parser)
    add_admin_args(parser)
    add_auth_args(parser)
    add_http_frontend_args(parser)
    add_observability_args(parser)
    return parser


def add_auth_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Authenticated clients (CurveZMQ)", "See the threat model in docs/operations.md."
    )
    group.add_argument(
        "--curve-secret-key-file",
        default=None,
        metavar="PATH",
        help="The server's CURVE key pair (a NAME.key_secret file from `lmcache keys new "
        "NAME`). With --authorized-keys, the RPC port is encrypted and admits only listed "
        "client keys; a client without a listed key gets no reply at all. Off by default.",
    )
    group.add_argument(
        "--authorized-keys",
        default=None,
        metavar="DIR",
        help="Directory of the client public keys (*.key files) admitted on the RPC port; "
        "needs --curve-secret-key-file.",
    )
    group.add_argument(
        "--tenants-file",
        default=None,
        metavar="PATH",
        help="YAML or JSON file binding each authorized client key to a tenant (models, "
        "cache salts, byte quota, read-only shares); enforced on every operation. Needs "
        "--authorized-keys. See docs/server.md.",
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
        "--http-header-timeout-s",
        type=positive_float,
        default=DEFAULT_HTTP_HEADER_TIMEOUT_S,
        metavar="SECONDS",
        help="Close an HTTP connection whose request line and headers have not all arrived "
        "this long after it opened or after its previous response (slowloris clients); "
        "408 when part of a request had come.",
    )
    group.add_argument(
        "--http-body-timeout-s",
        type=positive_float,
        default=DEFAULT_HTTP_BODY_TIMEOUT_S,
        metavar="SECONDS",
        help="Close an HTTP connection whose request body has not all arrived this long "
        "after its headers.",
    )
    group.add_argument(
        "--http-max-connections",
        type=positive_int,
        default=DEFAULT_HTTP_MAX_CONNECTIONS,
        metavar="N",
        help="Most HTTP connections open at once (they share the process's descriptor limit "
        "with ZMQ). A new one past it closes the connection idle longest; when every "
        "connection has a request in progress it gets 503 and is closed.",
    )
    group.add_argument(
        "--http-tls-certfile",
        default=None,
        metavar="PATH",
        help="PEM certificate (chain) for HTTPS on the HTTP frontend and the Prometheus "
        "listener; with --http-tls-keyfile. Off by default (plain HTTP).",
    )
    group.add_argument(
        "--http-tls-keyfile", default=None, metavar="PATH", help="PEM key of --http-tls-certfile."
    )
    group.add_argument(
        "--http-read-token-file",
        default=None,
        metavar="PATH",
        help="File holding a bearer token the HTTP read routes (/status, /config, /metrics, "
        "/threads, ...) then require as 'Authorization: Bearer TOKEN' (the admin token is "
        "accepted too); / and /healthcheck stay open for probes. At least 16 characters.",
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
        "configured, the request must carry it; on a non-loopback --http-host the server "
        "refuses to start without one.",
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
