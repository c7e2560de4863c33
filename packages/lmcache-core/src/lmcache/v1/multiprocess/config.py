"""``MPServerConfig`` and the ``lmcache server`` flags (upstream names where they exist)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import uuid

from lmcache.v1.config import CACHE_POLICIES
from lmcache.v1.multiprocess.protocol import DEFAULT_MAX_MESSAGE_BYTES
from lmcache.v1.multiprocess.transfer_mode import MPTransferMode

AUTO_SHM = "auto"
_DEFAULT_L1_CAP_GB = 1.0
_DEFAULT_L1_FREE_FRACTION = 0.25


@dataclasses.dataclass
class MPServerConfig:
    host: str = "127.0.0.1"
    port: int = 5555
    instance_id: str = ""
    chunk_size: int = 256
    max_workers: int | None = None
    max_gpu_workers: int | None = None
    max_cpu_workers: int | None = None
    l1_size_gb: float | None = None
    eviction_policy: str = "LRU"
    supported_transfer_mode: MPTransferMode = MPTransferMode.LMCACHE_DRIVEN
    shm_name: str = AUTO_SHM
    l2_disk_path: str | None = None
    l2_disk_size_gb: float = 0.0
    l2_disk_adopt: bool = False
    l2_adapters: list[str] = dataclasses.field(default_factory=list)
    worker_reap_timeout_seconds: float = 120.0
    session_ttl_seconds: float = 600.0
    pending_transfer_timeout_seconds: float = 60.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    blocking_timeout_secs: int = 2
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    prometheus_port: int = 9090
    disable_metrics: bool = False
    enable_http_cache_clear: bool = False
    enable_admin_ops: bool = False
    admin_token: str | None = dataclasses.field(default=None, repr=False)
    admin_token_file: str | None = None

    def resolved_instance_id(self) -> str:
        return self.instance_id or uuid.uuid4().hex

    def resolved_l1_size_gb(self) -> float:
        if self.l1_size_gb is not None:
            return self.l1_size_gb
        return default_l1_size_gb()

    def resolved_shm_name(self) -> str | None:
        """``None`` disables SHM; ``auto`` picks a fresh name."""
        if not self.shm_name:
            return None
        if self.shm_name == AUTO_SHM:
            return f"lmcache_mp_{os.getpid()}_{uuid.uuid4().hex[:12]}"
        return self.shm_name.lstrip("/")

    def pool_workers(self) -> tuple[int, int]:
        """(transfer pool threads, other pool threads)."""
        base = self.max_workers or min(4, os.cpu_count() or 1)
        return self.max_gpu_workers or base, self.max_cpu_workers or base


def _meminfo_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def default_l1_size_gb() -> float:
    """min(1 GiB, a quarter of available memory, a quarter of free /dev/shm)."""
    candidates = [_DEFAULT_L1_CAP_GB]
    available = _meminfo_available_bytes()
    if available:
        candidates.append(available * _DEFAULT_L1_FREE_FRACTION / 1024**3)
    try:
        st = os.statvfs("/dev/shm")
        candidates.append(st.f_bavail * st.f_frsize * _DEFAULT_L1_FREE_FRACTION / 1024**3)
    except OSError:
        pass
    return max(1 / 1024, min(candidates))


def add_mp_server_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("MP server")
    group.add_argument("--host", default="127.0.0.1", help="Bind address (default 127.0.0.1).")
    group.add_argument("--port", type=int, default=5555, help="ZMQ port (default 5555).")
    group.add_argument("--instance-id", default=None, help="Server id (default: random).")
    group.add_argument("--chunk-size", type=int, default=256, help="Tokens per chunk.")
    group.add_argument(
        "--max-workers",
        type=int,
        default=None,
        help="Handler threads per pool (default: min(4, CPUs); upstream default 1).",
    )
    group.add_argument("--max-gpu-workers", type=int, default=None, help="Transfer pool size.")
    group.add_argument("--max-cpu-workers", type=int, default=None, help="Lookup pool size.")
    group.add_argument(
        "--supported-transfer-mode",
        choices=[m.value for m in MPTransferMode],
        default=MPTransferMode.LMCACHE_DRIVEN.value,
        help="Transfer modes served: lmcache_driven (store/retrieve into registered KV "
        "caches), engine_driven (prepare/commit), auto (both). Default lmcache_driven.",
    )
    group.add_argument(
        "--shm-name",
        default=AUTO_SHM,
        help="POSIX shared-memory name of L1, shared with engine-driven workers (SHM "
        "sub-path). Default 'auto' (a fresh name); '' disables SHM (inline sub-path only).",
    )
    group.add_argument(
        "--worker-reap-timeout-seconds",
        type=float,
        default=120.0,
        help="Forget a worker (and release its shared memory) after this long without "
        "contact; 0 disables.",
    )
    group.add_argument("--session-ttl-seconds", type=float, default=600.0)
    group.add_argument(
        "--pending-transfer-timeout-seconds",
        type=float,
        default=60.0,
        help="Free prepared-but-uncommitted engine-driven transfers after this long.",
    )
    group.add_argument(
        "--max-message-mb",
        type=float,
        default=DEFAULT_MAX_MESSAGE_BYTES / 1024**2,
        help="Largest request accepted (MiB); larger ones get a message_too_large error.",
    )
    storage = parser.add_argument_group("Storage")
    storage.add_argument(
        "--l1-size-gb",
        type=float,
        default=None,
        help="L1 (host memory) size in GiB; default min(1, 1/4 of available memory).",
    )
    storage.add_argument(
        "--eviction-policy",
        choices=list(CACHE_POLICIES),
        default="LRU",
        type=lambda s: s.upper(),
        help="L1 eviction policy (default LRU).",
    )
    storage.add_argument("--l2-disk-path", default=None, help="Directory of the disk tier (L2).")
    storage.add_argument("--l2-disk-size-gb", type=float, default=0.0, help="Disk tier size.")
    storage.add_argument(
        "--l2-disk-adopt",
        action="store_true",
        help="Use a disk tier folder that holds files the tier did not write; they are left "
        "untouched (without it such a folder is refused).",
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
    add_admin_args(parser)
    add_http_frontend_args(parser)
    add_observability_args(parser)


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
        type=int,
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


def add_observability_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Observability")
    group.add_argument(
        "--disable-metrics",
        action="store_true",
        help="Keep no Prometheus metrics (no hot-path cost; /metrics answers 404).",
    )
    group.add_argument(
        "--prometheus-port",
        type=int,
        default=9090,
        help="Also serve /metrics on this port (on --http-host); 0 disables it.",
    )


def config_from_args(args: argparse.Namespace) -> MPServerConfig:
    return MPServerConfig(
        host=args.host,
        port=args.port,
        instance_id=args.instance_id or "",
        chunk_size=args.chunk_size,
        max_workers=args.max_workers,
        max_gpu_workers=args.max_gpu_workers,
        max_cpu_workers=args.max_cpu_workers,
        l1_size_gb=args.l1_size_gb,
        eviction_policy=args.eviction_policy,
        supported_transfer_mode=MPTransferMode.parse(args.supported_transfer_mode),
        shm_name=args.shm_name,
        l2_disk_path=args.l2_disk_path,
        l2_disk_size_gb=args.l2_disk_size_gb,
        l2_disk_adopt=args.l2_disk_adopt,
        l2_adapters=list(args.l2_adapter),
        worker_reap_timeout_seconds=args.worker_reap_timeout_seconds,
        session_ttl_seconds=args.session_ttl_seconds,
        pending_transfer_timeout_seconds=args.pending_transfer_timeout_seconds,
        max_message_bytes=int(args.max_message_mb * 1024**2),
        http_host=args.http_host,
        http_port=args.http_port,
        prometheus_port=args.prometheus_port,
        disable_metrics=args.disable_metrics,
        enable_http_cache_clear=args.enable_http_cache_clear,
        enable_admin_ops=args.enable_admin_ops,
        admin_token=args.admin_token,
        admin_token_file=args.admin_token_file,
    )
