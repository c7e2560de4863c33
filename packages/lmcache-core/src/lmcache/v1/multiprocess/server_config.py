"""``MPServerConfig``: the cache server's configuration, built from the ``lmcache server`` flags.

Every flag parses through a ``type=`` validator (:mod:`.flag_types`), and a ``--config``
file's values go through the very same validators (:mod:`.config_file`), so a bad port or
size is a one-line error naming the flag before anything is allocated.  The flags
themselves are declared in :mod:`.server_flags`.

Only settings this server acts on are fields here.  Upstream 0.5.6's module of the same
role, ``lmcache.v1.multiprocess.config``, is this one plus upstream's settings for
features this server lacks (coordinator, P2P, gRPC transport, CacheBlend, server
modules); it lives in ``lmcache.compat.upstream_056.mp_config``, and those flags reach
``lmcache server`` as a server extension (:mod:`.server.extensions`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import uuid
from collections.abc import Callable
from typing import Any

from lmcache.v1.config import CACHE_POLICIES
from lmcache.v1.multiprocess.config_file import (
    apply_config_file,
    explicit_flags,
    load_config_file,
    track_explicit_flags,
)
from lmcache.v1.multiprocess.flag_types import (
    LOG_LEVELS,
    log_level,
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
from lmcache.v1.multiprocess.l1_manager_spec import L1ManagerSpec, parse_l1_managers
from lmcache.v1.multiprocess.runtime_plugins.settings import (
    RuntimePluginConfig,
    add_runtime_plugin_args,
    parse_args_to_runtime_plugin_config,
)
from lmcache.v1.multiprocess.server_flags import (
    AUTO_SHM,
    DEFAULT_HTTP_BODY_TIMEOUT_S,
    DEFAULT_HTTP_HEADER_TIMEOUT_S,
    DEFAULT_HTTP_MAX_CONNECTIONS,
    add_admin_args,
    add_http_frontend_args,
    add_mp_server_args,
    add_observability_args,
)
from lmcache.v1.multiprocess.wire.protocol import (
    DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
)
from lmcache.v1.platform.transfer_mode import MPTransferMode
from lmcache.v1.storage_backend.l1_settings import PREFETCH_POLICIES, STORE_POLICIES, L1Settings
from lmcache.v1.storage_backend.tier_settings import TierSettings

__all__ = [
    "AUTO_SHM",
    "CACHE_POLICIES",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "LOG_LEVELS",
    "MPServerConfig",
    "MPTransferMode",
    "RuntimePluginConfig",
    "add_runtime_plugin_args",
    "parse_args_to_runtime_plugin_config",
    "add_admin_args",
    "add_http_frontend_args",
    "add_mp_server_args",
    "add_observability_args",
    "apply_config_file",
    "config_from_args",
    "default_l1_size_gb",
    "explicit_flags",
    "load_config_file",
    "log_level",
    "meminfo_available_bytes",
    "non_negative_float",
    "parse_args_to_mp_server_config",
    "positive_float",
    "positive_int",
    "tcp_port",
    "tcp_port_or_off",
    "track_explicit_flags",
    "usable_directory",
]

_DEFAULT_L1_CAP_GB = 1.0
_DEFAULT_L1_FREE_FRACTION = 0.25


def l1_settings_from_flags(values: Any) -> L1Settings:
    """:class:`L1Settings` from upstream's storage-manager flag values, read by their
    destinations (``eviction_trigger_watermark``, ``l1_read_ttl_seconds``, ...): parsed
    arguments or an :class:`MPServerConfig` alike."""
    return L1Settings(
        eviction_trigger_watermark=values.eviction_trigger_watermark,
        eviction_ratio=values.eviction_ratio,
        read_ttl_seconds=float(values.l1_read_ttl_seconds),
        write_ttl_seconds=float(values.l1_write_ttl_seconds),
        use_lazy=values.l1_use_lazy,
        init_size_gb=values.l1_init_size_gb,
        align_bytes=values.l1_align_bytes,
        use_hugepages=values.l1_use_hugepages,
        notifier_interval_ms=values.periodic_notifier_interval_ms,
    )


@dataclasses.dataclass
class MPServerConfig:
    host: str = "127.0.0.1"
    port: int = 5555
    # A fresh id per config, as upstream; "" (set explicitly) is resolved at start-up.
    instance_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    chunk_size: int = 256
    max_workers: int | None = None
    max_gpu_workers: int | None = None
    max_cpu_workers: int | None = None
    l1_size_gb: float | None = None
    eviction_policy: str = "LRU"
    supported_transfer_mode: MPTransferMode = MPTransferMode.AUTO
    shm_name: str = AUTO_SHM
    l2_disk_path: str | None = None
    l2_disk_size_gb: float = 0.0
    l2_disk_adopt: bool = False
    l2_adapters: list[str] = dataclasses.field(default_factory=list)
    l2_prefetch_max_in_flight: int = 8
    l2_prefetch_wait_timeout_seconds: float = 30.0
    # Upstream's storage-manager flags (server_flags.add_storage_manager_args).
    l1_use_lazy: bool = True
    l1_init_size_gb: float = 20.0
    l1_align_bytes: int = 4096
    l1_use_hugepages: bool = False
    l1_devdax_path: str | None = None
    gds_l1_path: str | None = None
    gds_l1_use_direct_io: bool | None = None
    gds_l1_backend: str | None = None
    l1_write_ttl_seconds: int = 600
    l1_read_ttl_seconds: int = 300
    eviction_trigger_watermark: float = 0.8
    eviction_ratio: float = 0.2
    l2_store_policy: str = "default"
    l2_prefetch_policy: str = "default"
    periodic_notifier_interval_ms: int = 5
    kv_event_log_size: int = 32768
    worker_reap_timeout_seconds: float = 120.0
    session_ttl_seconds: float = 600.0
    pending_transfer_timeout_seconds: float = 60.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
    blocking_timeout_secs: int = 2
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    http_header_timeout_s: float = DEFAULT_HTTP_HEADER_TIMEOUT_S
    http_body_timeout_s: float = DEFAULT_HTTP_BODY_TIMEOUT_S
    http_max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS
    prometheus_port: int = 9090
    disable_metrics: bool = False
    enable_http_cache_clear: bool = False
    run_script_api_enabled: bool = False
    script_allowed_imports: list[str] = dataclasses.field(default_factory=list)
    enable_admin_ops: bool = False
    admin_token: str | None = dataclasses.field(default=None, repr=False)
    admin_token_file: str | None = None
    # CurveZMQ and tenants (lmcache.v1.multiprocess.wire.curve, .server.tenants).
    curve_secret_key_file: str | None = None
    authorized_keys: str | None = None
    tenants_file: str | None = None
    # TLS of the HTTP frontend and the Prometheus listener; the HTTP read routes' token.
    http_tls_certfile: str | None = None
    http_tls_keyfile: str | None = None
    http_read_token_file: str | None = None
    # Started beside the server (:mod:`.runtime_plugin_config`).
    runtime_plugin_config: RuntimePluginConfig = dataclasses.field(
        default_factory=RuntimePluginConfig
    )

    def validate(self) -> MPServerConfig:
        """The flag validators, for configs built in code; raises ``ValueError``."""
        checks: list[tuple[str, Callable[[str], Any], Any]] = [
            ("--port", tcp_port, self.port),
            ("--chunk-size", positive_int, self.chunk_size),
            ("--http-port", tcp_port_or_off, self.http_port),
            ("--prometheus-port", tcp_port_or_off, self.prometheus_port),
            ("--http-header-timeout-s", positive_float, self.http_header_timeout_s),
            ("--http-body-timeout-s", positive_float, self.http_body_timeout_s),
            ("--http-max-connections", positive_int, self.http_max_connections),
            ("--max-message-mb", positive_int, self.max_message_bytes),
            ("--max-inflight-mb", positive_int, self.max_inflight_bytes),
            ("--session-ttl-seconds", positive_float, self.session_ttl_seconds),
            (
                "--pending-transfer-timeout-seconds",
                positive_float,
                self.pending_transfer_timeout_seconds,
            ),
            (
                "--worker-reap-timeout-seconds",
                non_negative_float,
                self.worker_reap_timeout_seconds,
            ),
            ("--l2-disk-size-gb", non_negative_float, self.l2_disk_size_gb),
            ("--l2-prefetch-max-in-flight", non_negative_int, self.l2_prefetch_max_in_flight),
            ("--kv-event-log-size", non_negative_int, self.kv_event_log_size),
            (
                "--l2-prefetch-wait-timeout-seconds",
                positive_float,
                self.l2_prefetch_wait_timeout_seconds,
            ),
            ("--l1-init-size-gb", positive_float, self.l1_init_size_gb),
            ("--l1-align-bytes", power_of_two, self.l1_align_bytes),
            ("--l1-write-ttl-seconds", positive_int, self.l1_write_ttl_seconds),
            ("--l1-read-ttl-seconds", positive_int, self.l1_read_ttl_seconds),
            ("--eviction-trigger-watermark", unit_fraction, self.eviction_trigger_watermark),
            ("--eviction-ratio", unit_fraction, self.eviction_ratio),
            (
                "--periodic-notifier-interval-ms",
                positive_int,
                self.periodic_notifier_interval_ms,
            ),
        ]
        optional = [
            ("--l1-size-gb", positive_float, self.l1_size_gb),
            ("--max-workers", positive_int, self.max_workers),
            ("--max-gpu-workers", positive_int, self.max_gpu_workers),
            ("--max-cpu-workers", positive_int, self.max_cpu_workers),
            ("--l2-disk-path", usable_directory, self.l2_disk_path),
        ]
        checks += [c for c in optional if c[2] is not None]
        for flag, check, value in checks:
            if isinstance(value, bool):
                raise ValueError(f"argument {flag}: expected a number, got {value!r}")
            try:
                check(str(value))
            except argparse.ArgumentTypeError as exc:
                raise ValueError(f"argument {flag}: {exc}") from None
        self._check_storage_manager_choices()
        if self.max_inflight_bytes < self.max_message_bytes:
            raise ValueError(
                f"argument --max-inflight-mb: {self.max_inflight_bytes / 1024**2:g} MiB is "
                f"below --max-message-mb ({self.max_message_bytes / 1024**2:g} MiB): a request "
                f"the size limit admits would always be refused as busy"
            )
        return self

    def _check_storage_manager_choices(self) -> None:
        """Upstream's storage flags this server cannot honour, refused with the reason."""
        if self.l1_devdax_path is not None:
            raise ValueError(
                "argument --l1-devdax-path: refused: a Device-DAX L1 needs a /dev/dax device, "
                "which this server does not drive (L1 is host memory)"
            )
        gds = {
            "--gds-l1-path": self.gds_l1_path,
            "--gds-l1-use-direct-io": self.gds_l1_use_direct_io,
            "--gds-l1-backend": self.gds_l1_backend,
        }
        for flag, value in gds.items():
            if value is not None:
                raise ValueError(
                    f"argument {flag}: refused: a GPUDirect-Storage L1 needs cuFile/hipFile, "
                    f"which this server does not use (L1 is host memory)"
                )
        if self.l2_store_policy not in STORE_POLICIES:
            raise ValueError(
                f"argument --l2-store-policy: {self.l2_store_policy!r} is not one of "
                f"{', '.join(STORE_POLICIES)}"
            )
        if self.l2_prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(
                f"argument --l2-prefetch-policy: {self.l2_prefetch_policy!r} is not one of "
                f"{', '.join(PREFETCH_POLICIES)}"
            )
        if self.l1_use_hugepages and self.shm_name:
            raise ValueError(
                "argument --l1-use-hugepages: needs private memory, but L1 is in shared memory "
                "(--shm-name); pass --shm-name '' as upstream requires"
            )
        if self.eviction_policy not in CACHE_POLICIES:
            raise ValueError(
                f"argument --eviction-policy: {self.eviction_policy!r} is not one of "
                f"{', '.join(CACHE_POLICIES)}"
            )

    def l1_settings(self) -> L1Settings:
        """How L1 manages its memory (upstream's storage-manager flags)."""
        return l1_settings_from_flags(self)

    def prepared_store_ttl_seconds(self) -> float:
        """A prepared store holds its L1 memory at most this long: the earlier of
        --pending-transfer-timeout-seconds and upstream's write-lock TTL."""
        return min(self.pending_transfer_timeout_seconds, float(self.l1_write_ttl_seconds))

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
            from lmcache.v1.platform.cpu.shm import new_l1_segment_name

            # The name records this process, so a later server can reclaim it if we die.
            return new_l1_segment_name()
        return self.shm_name.lstrip("/")

    def tier_settings(self) -> TierSettings:
        """The storage tiers these flags ask for (checks the --l2-* inputs; allocates nothing)."""
        return TierSettings.from_server_flags(
            chunk_size=self.chunk_size,
            l1_size_gb=self.resolved_l1_size_gb(),
            eviction_policy=self.eviction_policy,
            blocking_timeout_secs=self.blocking_timeout_secs,
            l2_disk_path=self.l2_disk_path,
            l2_disk_size_gb=self.l2_disk_size_gb,
            l2_disk_adopt=self.l2_disk_adopt,
            l2_adapters=self.l2_adapters,
            l1=self.l1_settings(),
            store_policy=self.l2_store_policy,
        )

    def pool_workers(self) -> tuple[int, int]:
        """(transfer pool threads, other pool threads)."""
        base = self.max_workers or min(4, os.cpu_count() or 1)
        return self.max_gpu_workers or base, self.max_cpu_workers or base


def meminfo_available_bytes() -> int | None:
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
    available = meminfo_available_bytes()
    if available:
        candidates.append(available * _DEFAULT_L1_FREE_FRACTION / 1024**3)
    from lmcache.v1.platform.cpu.shm import SHM_DIR

    try:
        st = os.statvfs(SHM_DIR)
        candidates.append(st.f_bavail * st.f_frsize * _DEFAULT_L1_FREE_FRACTION / 1024**3)
    except OSError:
        pass
    return max(1 / 1024, min(candidates))


def config_from_args(args: argparse.Namespace) -> MPServerConfig:
    """The config the flags describe; :meth:`MPServerConfig.validate` checks it.  A DRAM
    ``--l1-manager`` sets L1's values (``ValueError`` for one this server refuses)."""
    config = _flags_config(args)
    spec = parse_l1_managers(list(getattr(args, "l1_manager", None) or []))
    if spec is not None:
        if args.l1_size_gb is not None:
            raise ValueError("use either --l1-manager or --l1-size-gb, not both (as upstream)")
        apply_l1_manager(config, spec)
    return config


def apply_l1_manager(config: MPServerConfig, spec: L1ManagerSpec) -> None:
    """Set ``config``'s L1 values from a DRAM ``--l1-manager`` (fields it omits keep the
    flags' values)."""
    config.l1_size_gb = spec.size_gb
    overrides = {
        "l1_align_bytes": spec.align_bytes,
        "l1_use_lazy": spec.use_lazy,
        "l1_init_size_gb": spec.init_size_gb,
        "l1_use_hugepages": spec.use_hugepages,
        "shm_name": spec.shm_name,
        "l1_read_ttl_seconds": spec.read_ttl_seconds,
        "l1_write_ttl_seconds": spec.write_ttl_seconds,
        "eviction_policy": spec.eviction_policy,
        "eviction_trigger_watermark": spec.trigger_watermark,
        "eviction_ratio": spec.eviction_ratio,
    }
    for name, value in overrides.items():
        if value is not None:
            setattr(config, name, value)


def _flags_config(args: argparse.Namespace) -> MPServerConfig:
    return MPServerConfig(
        host=args.host,
        port=args.port,
        instance_id=args.instance_id or uuid.uuid4().hex,
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
        l2_prefetch_max_in_flight=args.l2_prefetch_max_in_flight,
        l2_prefetch_wait_timeout_seconds=args.l2_prefetch_wait_timeout_seconds,
        l1_use_lazy=args.l1_use_lazy,
        l1_init_size_gb=args.l1_init_size_gb,
        l1_align_bytes=args.l1_align_bytes,
        l1_use_hugepages=args.l1_use_hugepages,
        l1_devdax_path=args.l1_devdax_path,
        gds_l1_path=args.gds_l1_path,
        gds_l1_use_direct_io=args.gds_l1_use_direct_io,
        gds_l1_backend=args.gds_l1_backend,
        l1_write_ttl_seconds=args.l1_write_ttl_seconds,
        l1_read_ttl_seconds=args.l1_read_ttl_seconds,
        eviction_trigger_watermark=args.eviction_trigger_watermark,
        eviction_ratio=args.eviction_ratio,
        l2_store_policy=args.l2_store_policy,
        l2_prefetch_policy=args.l2_prefetch_policy,
        periodic_notifier_interval_ms=args.periodic_notifier_interval_ms,
        kv_event_log_size=args.kv_event_log_size,
        worker_reap_timeout_seconds=args.worker_reap_timeout_seconds,
        session_ttl_seconds=args.session_ttl_seconds,
        pending_transfer_timeout_seconds=args.pending_transfer_timeout_seconds,
        max_message_bytes=int(args.max_message_mb * 1024**2),
        max_inflight_bytes=int(args.max_inflight_mb * 1024**2),
        http_host=args.http_host,
        http_port=args.http_port,
        http_header_timeout_s=args.http_header_timeout_s,
        http_body_timeout_s=args.http_body_timeout_s,
        http_max_connections=args.http_max_connections,
        prometheus_port=args.prometheus_port,
        disable_metrics=args.disable_metrics,
        enable_http_cache_clear=args.enable_http_cache_clear,
        run_script_api_enabled=args.run_script_api_enabled,
        script_allowed_imports=list(args.script_allowed_imports),
        enable_admin_ops=args.enable_admin_ops,
        admin_token=args.admin_token,
        admin_token_file=args.admin_token_file,
        curve_secret_key_file=args.curve_secret_key_file,
        authorized_keys=args.authorized_keys,
        tenants_file=args.tenants_file,
        http_tls_certfile=args.http_tls_certfile,
        http_tls_keyfile=args.http_tls_keyfile,
        http_read_token_file=args.http_read_token_file,
        runtime_plugin_config=parse_args_to_runtime_plugin_config(args),
    )


def parse_args_to_mp_server_config(args: argparse.Namespace) -> MPServerConfig:
    """Upstream's name: :func:`config_from_args`, validated (``ValueError`` if bad)."""
    return config_from_args(args).validate()
