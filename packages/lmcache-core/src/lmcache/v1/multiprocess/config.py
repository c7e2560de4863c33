"""``MPServerConfig`` and the ``lmcache server`` flags (upstream names where they exist).

Every flag parses through a ``type=`` validator, and a ``--config`` file's values go
through the very same validators (:func:`apply_config_file`), so a bad port or size is a
one-line error naming the flag before anything is allocated.  The parser records which
flags were given on the command line (:func:`explicit_flags`): precedence is
defaults < config file < flags given on the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lmcache.v1.config import CACHE_POLICIES
from lmcache.v1.multiprocess.wire.protocol import DEFAULT_MAX_MESSAGE_BYTES
from lmcache.v1.platform.transfer_mode import MPTransferMode

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
    supported_transfer_mode: MPTransferMode = MPTransferMode.AUTO
    shm_name: str = AUTO_SHM
    l2_disk_path: str | None = None
    l2_disk_size_gb: float = 0.0
    l2_disk_adopt: bool = False
    l2_adapters: list[str] = dataclasses.field(default_factory=list)
    l2_prefetch_max_in_flight: int = 8
    l2_prefetch_wait_timeout_seconds: float = 30.0
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

    def validate(self) -> MPServerConfig:
        """The flag validators, for configs built in code; raises ``ValueError``."""
        checks: list[tuple[str, Callable[[str], Any], Any]] = [
            ("--port", tcp_port, self.port),
            ("--chunk-size", positive_int, self.chunk_size),
            ("--http-port", tcp_port_or_off, self.http_port),
            ("--prometheus-port", tcp_port_or_off, self.prometheus_port),
            ("--max-message-mb", positive_int, self.max_message_bytes),
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
            (
                "--l2-prefetch-wait-timeout-seconds",
                positive_float,
                self.l2_prefetch_wait_timeout_seconds,
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
        return self

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
    try:
        st = os.statvfs("/dev/shm")
        candidates.append(st.f_bavail * st.f_frsize * _DEFAULT_L1_FREE_FRACTION / 1024**3)
    except OSError:
        pass
    return max(1 / 1024, min(candidates))


# ---------------------------------------------------------------------------------------
# Flag validators (argparse ``type=``); a config file's values go through them too
# ---------------------------------------------------------------------------------------

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_EXPLICIT_ATTR = "_explicit_flags"


def _number(text: str, kind: Callable[[str], Any], what: str) -> Any:
    try:
        return kind(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def tcp_port(text: str) -> int:
    """A TCP port, 1-65535 (0 would bind a random port while announcing another)."""
    port = _number(text, int, "an integer port")
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1-65535)")
    return int(port)


def tcp_port_or_off(text: str) -> int:
    """A TCP port, or 0 to turn the endpoint off."""
    port = _number(text, int, "an integer port")
    if port != 0 and not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1-65535, or 0 for off)")
    return int(port)


def positive_int(text: str) -> int:
    value = _number(text, int, "an integer")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return int(value)


def non_negative_int(text: str) -> int:
    value = _number(text, int, "an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return int(value)


def positive_float(text: str) -> float:
    value = _number(text, float, "a number")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number > 0")
    return float(value)


def non_negative_float(text: str) -> float:
    value = _number(text, float, "a number")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{value} must be a finite number >= 0")
    return float(value)


def log_level(text: str) -> str:
    level = str(text).strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown log level {text!r}; choose from {', '.join(LOG_LEVELS)}"
        )
    return level


def usable_directory(text: str) -> str:
    """A directory we can write into, or one we can create (its nearest parent is)."""
    path = Path(str(text)).expanduser()
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"directory {text!r} is not writable")
        return str(text)
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(
            f"{text!r} does not exist and cannot be created ({parent} is not writable)"
        )
    return str(text)


def _upper(text: str) -> str:
    return str(text).upper()


# ---------------------------------------------------------------------------------------
# Tracking which flags the command line gave (so it can win over a config file)
# ---------------------------------------------------------------------------------------


def _mark_explicit(namespace: argparse.Namespace, dest: str) -> None:
    explicit = getattr(namespace, _EXPLICIT_ATTR, None)
    if explicit is None:
        explicit = set()
        setattr(namespace, _EXPLICIT_ATTR, explicit)
    explicit.add(dest)


class _TrackedStore(argparse._StoreAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        super().__call__(parser, namespace, values, option)
        _mark_explicit(namespace, self.dest)


class _TrackedStoreTrue(argparse._StoreTrueAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        super().__call__(parser, namespace, values, option)
        _mark_explicit(namespace, self.dest)


class _TrackedAppend(argparse._AppendAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        super().__call__(parser, namespace, values, option)
        _mark_explicit(namespace, self.dest)


def track_explicit_flags(parser: argparse.ArgumentParser) -> None:
    """Make every later ``add_argument`` on ``parser`` record that its flag was given."""
    parser.register("action", None, _TrackedStore)
    parser.register("action", "store", _TrackedStore)
    parser.register("action", "store_true", _TrackedStoreTrue)
    parser.register("action", "append", _TrackedAppend)


def explicit_flags(args: argparse.Namespace) -> set[str]:
    """Destinations of the flags given on the command line."""
    return set(getattr(args, _EXPLICIT_ATTR, set()))


# ---------------------------------------------------------------------------------------
# Config files (``lmcache server --config``): same validators, lower precedence
# ---------------------------------------------------------------------------------------


def load_config_file(path: str) -> dict[str, Any]:
    """A YAML or JSON mapping of flag names (dashes or underscores) to values."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read --config {path!r}: {exc.strerror or exc}") from None
    try:
        if path.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:
        reason = " ".join(str(exc).split())
        raise ValueError(f"--config {path!r} is not valid YAML/JSON: {reason}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path!r}: expected a mapping of flag names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _flag_name(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def _convert_config_value(action: argparse.Action, value: Any, source: str) -> Any:
    """Run one config value through the flag's own ``type`` and ``choices``."""
    where = f"{_flag_name(action)} (from {source})"
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_convert_scalar(action, json.dumps(i) if isinstance(i, dict) else i, where)
                for i in items]  # fmt: skip
    if value is None:
        return None
    return _convert_scalar(action, value, where)


def _convert_scalar(action: argparse.Action, value: Any, where: str) -> Any:
    if isinstance(value, (dict, list, bool)):
        raise ValueError(f"{where}: expected a single value, got {value!r}")
    converted: Any = str(value)
    if action.type is not None:
        try:
            converted = action.type(converted)  # type: ignore[operator]
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(str(c) for c in action.choices)
        raise ValueError(f"{where}: invalid choice {value!r} (choose from {choices})")
    return converted


def apply_config_file(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    values: Mapping[str, Any],
    source: str,
    ignore: frozenset[str] = frozenset(),
) -> None:
    """Set ``values`` on ``args`` for every flag the command line did not give."""
    actions = {
        a.dest: a
        for a in parser._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction) and a.dest not in ignore
    }
    unknown = sorted(set(values) - set(actions))
    if unknown:
        raise ValueError(f"unknown keys in {source}: {', '.join(unknown)}")
    given = explicit_flags(args)
    converted = {
        name: _convert_config_value(actions[name], v, source) for name, v in values.items()
    }
    for name, value in converted.items():
        if name not in given:
            setattr(args, name, value)


def add_mp_server_args(parser: argparse.ArgumentParser) -> None:
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
    group.add_argument("--session-ttl-seconds", type=positive_float, default=600.0)
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
        type=_upper,
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
        l2_prefetch_max_in_flight=args.l2_prefetch_max_in_flight,
        l2_prefetch_wait_timeout_seconds=args.l2_prefetch_wait_timeout_seconds,
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
