"""The ``lmcache server`` flags (upstream names where they exist), by group."""

from __future__ import annotations

import argparse

from lmcache.v1.config import CACHE_POLICIES
from lmcache.v1.multiprocess.config_file import track_explicit_flags
from lmcache.v1.multiprocess.flag_types import (
    eviction_policy_name,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    power_of_two,
    tcp_port,
    tcp_port_or_off,
    unit_fraction,
    usable_directory,
)
from lmcache.v1.multiprocess.runtime_plugins.settings import add_runtime_plugin_args
from lmcache.v1.multiprocess.wire.protocol import (
    DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
)
from lmcache.v1.platform.transfer_mode import MPTransferMode
from lmcache.v1.storage_backend.l1_settings import PREFETCH_POLICIES, STORE_POLICIES

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
    add_storage_args(parser)
    add_storage_manager_args(parser)
    add_runtime_plugin_args(parser)
    add_admin_args(parser)
    add_auth_args(parser)
    add_http_frontend_args(parser)
    add_observability_args(parser)
    return parser


def add_storage_args(parser: argparse.ArgumentParser) -> None:
    """The storage tiers: L1 size and policy, the disk tier, L2 adapters, prefetch."""
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
        type=eviction_policy_name,
        help="Eviction policy of L1 and the disk tier, any case (default LRU, as upstream "
        "when the flag is left out). ARC adapts between recent and reused chunks and "
        "resists scans; IsolatedLRU is LRU per cache_salt, evicting tenants over their "
        "quota (PUT /quota/{cache_salt}; a tenant without one counts as over) first and "
        "only their own chunks; noop never evicts (a full tier refuses new chunks); "
        "FIFO, LFU and MRU are ours.",
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
            '\'{"type": "resp", "url": "redis://127.0.0.1:6379"}\' (also "redis", "valkey"), '
            '\'{"type": "disk", "path": "/data", "size_gb": 10}\' (also "fs"), or an adapter '
            "of upstream's L2 adapter interface: "
            '\'{"type": "plugin", "module_path": "pkg.mod", "class_name": "MyAdapter"}\', '
            '"mock", "fault_inject".'
        ),
    )


def add_storage_manager_args(parser: argparse.ArgumentParser) -> None:
    """Upstream 0.5.6's storage-manager flags (its ``add_storage_manager_args``) beyond the
    ones above: names, defaults and meanings as upstream; docs/storage.md says what each
    does here.  Device-DAX and GDS L1 are refused with the reason (no such device here)."""
    group = parser.add_argument_group(
        "Storage manager (upstream flags)", "L1 memory, eviction and L2 policies."
    )
    group.add_argument(
        "--l1-manager",
        action="append",
        default=[],
        metavar="JSON",
        help="Tagged L1 as upstream's JSON: type DRAM (fields tag, size_gb, align_bytes, "
        "use_lazy, init_size_gb, use_hugepages, shm_name, read_ttl_seconds, "
        "write_ttl_seconds, eviction {eviction_policy, trigger_watermark, eviction_ratio}) "
        "configures L1 instead of the --l1-* flags; one L1 only. DEVDAX and GDS are refused.",
    )
    group.add_argument(
        "--l1-use-lazy",
        action="boolean_optional",
        default=True,
        help="Lazy L1: start with --l1-init-size-gb usable (reserved and prefaulted) and grow "
        "to --l1-size-gb in the background and on demand (default on, as upstream).",
    )
    group.add_argument(
        "--l1-init-size-gb",
        type=positive_float,
        default=20.0,
        help="L1 usable at start-up with --l1-use-lazy (GiB, capped at --l1-size-gb; default 20).",
    )
    group.add_argument(
        "--l1-align-bytes",
        type=power_of_two,
        default=4096,
        help="Alignment of every L1 object's offset, a power of two (default 4096).",
    )
    group.add_argument(
        "--l1-use-hugepages",
        action="boolean_optional",
        default=False,
        help="Map L1 from the 2 MiB hugepage pool (needs vm.nr_hugepages and --shm-name ''; "
        "lazy allocation is turned off, as upstream). Default off.",
    )
    group.add_argument(
        "--l1-devdax-path",
        default=None,
        help="Upstream's Device-DAX L1: refused here (no DAX device support).",
    )
    group.add_argument(
        "--gds-l1-path",
        default=None,
        help="Upstream's GPUDirect-Storage L1: refused here (no GDS support).",
    )
    group.add_argument(
        "--gds-l1-use-direct-io",
        action="boolean_optional",
        default=None,
        help="Upstream's GDS L1 option (upstream default on): refused here (no GDS support).",
    )
    group.add_argument(
        "--gds-l1-backend",
        default=None,
        help="Upstream's GDS L1 backend (upstream default auto): refused here (no GDS support).",
    )
    group.add_argument(
        "--l1-write-ttl-seconds",
        type=positive_int,
        default=600,
        help="A store's write lock lives this long: a prepared (engine-driven) store not "
        "committed by then is released (the earlier of this and "
        "--pending-transfer-timeout-seconds). Default 600.",
    )
    group.add_argument(
        "--l1-read-ttl-seconds",
        type=positive_int,
        default=300,
        help="A read lock (a lookup's pin) older than this no longer protects its chunk "
        "from L1 eviction. Default 300.",
    )
    group.add_argument(
        "--eviction-trigger-watermark",
        type=unit_fraction,
        default=0.8,
        help="L1 starts evicting ahead of need when its used bytes reach this fraction of "
        "--l1-size-gb, in (0, 1] (default 0.8).",
    )
    group.add_argument(
        "--eviction-ratio",
        type=unit_fraction,
        default=0.2,
        help="Fraction of L1's used bytes evicted (eviction-policy order) each time the "
        "watermark is reached, in (0, 1] (default 0.2).",
    )
    group.add_argument(
        "--l2-store-policy",
        choices=list(STORE_POLICIES),
        default="default",
        help="default: keep stored chunks in L1 and write them through to every lower "
        "tier; skip_l1: drop a chunk from L1 once a lower tier holds it (L1 as a write "
        "buffer).",
    )
    group.add_argument(
        "--l2-prefetch-policy",
        choices=list(PREFETCH_POLICIES),
        default="default",
        help="default: chunks prefetched from a lower tier leave L1 when the lookup "
        "session that wanted them ends; retain: they stay in L1 (subject to eviction).",
    )
    group.add_argument(
        "--periodic-notifier-interval-ms",
        type=positive_int,
        default=5,
        help="How often L1's eviction notifier checks usage against the watermark (ms, "
        "default 5); a put that crosses it wakes the notifier at once. (Upstream's is the "
        "re-poll heartbeat of adapters without a completion signal; no tier here needs one.)",
    )


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
