"""``kv_connector_extra_config`` keys of ``LMCacheMPConnector`` (upstream names and defaults).

Values arrive from JSON on the vLLM command line, so numbers and booleans are often strings
(``"lmcache.mp.port": "5555"``); each value is coerced to the type of its default.  Unknown
``lmcache.*`` keys are logged as warnings (a typo must not pass silently); a value that
cannot be coerced raises ``ValueError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from lmcache.integration.vllm.lazy_offload import LazyOffloadConfig, LazyOffloadPolicy
from lmcache.integration.vllm.server_placement import PLACEMENTS
from lmcache.v1.multiprocess.wire.curve import CurveClientKeys, client_keys_from_files
from lmcache.v1.platform.transfer_mode import ENV_MP_TRANSFER_MODE, MPTransferMode

logger = logging.getLogger(__name__)

PREFIX = "lmcache.mp."

# key suffix -> default.  The default's type is the type a value is coerced to; None means
# "no value" (server_urls: str or list; max_offload_tokens: int).
DEFAULTS: dict[str, Any] = {
    "server_urls": None,
    "host": "tcp://localhost",
    "port": 5555,
    "mq_timeout": 300.0,
    "heartbeat_interval": 10.0,
    "nonblocking_lookup_status": True,
    "mp_transfer_mode": "auto",
    "isolated_ipc": False,
    "use_vmm_api": False,
    "hash_algorithm": "blake3",
    "eager_prefetch": False,
    "save_decode_cache": False,
    "lazy_offload": False,
    # Read only with lazy_offload on (see .lazy_offload; upstream's names and defaults).
    "lazy_offload_policy": "EVICTION_AWARE",
    "lazy_offload_threshold": 100,
    "lazy_offload_select_count": 10,
    "lazy_offload_horizon_steps": 2.5,
    "lazy_offload_max_drain_per_step": 64,
    "lazy_offload_max_deferral_seconds": 0.0,
    # Ours (upstream always loads asynchronously): false loads inside start_load_kv.
    "async_load": True,
    # Ours: a request vLLM could not schedule yet is looked up again at most this often
    # (seconds; 0 = never): its prefix may have been stored by another request meanwhile.
    "lookup_refresh_interval": 0.2,
    "transfer_intermediate_tensors": False,
    "autostart": False,
    # Ours: "prefix" (each prefix on one server), "rank" (upstream's: TP ranks split over
    # the servers) or "auto" (rank where the world size allows it); see .server_placement.
    "server_placement": "auto",
    # Ours: CURVE keys for a server with --curve-secret-key-file (both, or neither): this
    # client's NAME.key_secret and the server's public NAME.key.
    "curve_secret_key_file": "",
    "curve_server_key_file": "",
    "autostart.server_args": (),
    "autostart.wait_timeout": 90.0,
}
DEFAULT_WAIT_TIMEOUT = DEFAULTS["autostart.wait_timeout"]
# Read by upstream outside the ``lmcache.mp.`` namespace.
MAX_OFFLOAD_TOKENS_KEY = "lmcache.max_offload_tokens"

# Keys accepted for compatibility whose feature this implementation does not provide; a
# non-default value is reported instead of being silently ignored.
UNSUPPORTED = {
    "use_vmm_api": "CUDA VMM allocations are not supported by lmcache-core",
    "transfer_intermediate_tensors": "intermediate tensors are not transferred",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
START_SERVER_HINT = "lmcache server --l1-size-gb 20 --eviction-policy LRU --port {port}"


def _coerce_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{key} must be a boolean (true/false), got {value!r}")


def _coerce_number(key: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{key} must be a number, got {value!r}")
    try:
        number = kind(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}"
        ) from None
    if kind is int and isinstance(value, float) and value != int(value):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    # NaN passes every "< 0" / "<= 0" bound below and compares false with any elapsed
    # time (lookup_refresh_interval: a repeat on every step); inf means "never" or "wait
    # forever", which no key here is meant to allow.
    if not math.isfinite(number):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    return number


def _coerce(key: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        return _coerce_bool(key, value)
    if isinstance(default, (int, float)):
        return _coerce_number(key, value, type(default))
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string, got {value!r}")
        return value.strip()
    if isinstance(default, tuple):
        if isinstance(value, str):
            return tuple(value.split())
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ValueError(f"{key} must be a list of strings, got {value!r}")
    return value


def ensure_transport_scheme(url: str) -> str:
    """``host:port`` -> ``tcp://host:port``; URLs with a scheme pass through."""
    url = url.strip()
    return url if "://" in url else f"tcp://{url}"


def _parse_server_urls(key: str, value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        items = [part for part in (p.strip() for p in value.split(",")) if part]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value if v.strip()]
    else:
        raise ValueError(f"{key} must be a list or a comma-separated string, got {value!r}")
    if not items:
        raise ValueError(f"{key} is empty")
    urls = [ensure_transport_scheme(url) for url in items]
    repeated = sorted({url for url in urls if urls.count(url) > 1})
    if repeated:
        raise ValueError(f"{key} names a server more than once: {repeated}")
    return urls


@dataclasses.dataclass(frozen=True)
class MPConnectorConfig:
    """The parsed extra config; ``server_urls`` is always resolved (host/port folded in)."""

    server_urls: tuple[str, ...]
    mq_timeout: float
    heartbeat_interval: float
    nonblocking_lookup_status: bool
    mp_transfer_mode: MPTransferMode
    isolated_ipc: bool
    hash_algorithm: str
    eager_prefetch: bool
    save_decode_cache: bool
    async_load: bool
    max_offload_tokens: int | None
    port: int
    # lmcache.mp.autostart: start a local server when none answers (see .autostart).
    autostart: bool = False
    autostart_server_args: tuple[str, ...] = ()
    autostart_wait_timeout: float = 90.0
    server_placement: str = "auto"
    # lmcache.mp.lazy_offload: stores deferred by a policy (see .lazy_offload); None = off.
    lazy_offload: LazyOffloadConfig | None = None
    # lmcache.mp.curve_*: keys for an authenticated, encrypted wire; None = plaintext.
    curve: CurveClientKeys | None = None
    # lmcache.mp.lookup_refresh_interval (see .scheduler_side); 0 = never look up again.
    lookup_refresh_interval: float = 0.2

    @property
    def start_server_hint(self) -> str:
        return START_SERVER_HINT.format(port=self.port)


def parse_extra_config(
    extra: Mapping[str, Any] | None, env: Mapping[str, str] | None = None
) -> MPConnectorConfig:
    """Validate ``kv_connector_extra_config``; raises ``ValueError`` naming the bad key."""
    extra = dict(extra or {})
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for key, value in extra.items():
        if key == MAX_OFFLOAD_TOKENS_KEY:
            continue
        if not key.startswith(PREFIX):
            if key.startswith("lmcache."):
                logger.warning("unknown LMCacheMPConnector extra config key %r ignored", key)
            continue
        suffix = key[len(PREFIX) :]
        if suffix not in DEFAULTS:
            known = ", ".join(PREFIX + k for k in DEFAULTS)
            logger.warning("unknown extra config key %r ignored (known keys: %s)", key, known)
            continue
        values[suffix] = value if suffix == "server_urls" else _coerce(key, value, DEFAULTS[suffix])

    def get(suffix: str) -> Any:
        return values.get(suffix, DEFAULTS[suffix])

    for suffix, why in UNSUPPORTED.items():
        if suffix in values and get(suffix) != DEFAULTS[suffix]:
            raise ValueError(f"{PREFIX}{suffix}={get(suffix)!r} is not supported: {why}")

    port = get("port")
    if not 0 < port < 65536:
        raise ValueError(f"{PREFIX}port must be in 1..65535, got {port}")
    for suffix in ("mq_timeout", "heartbeat_interval"):
        if get(suffix) <= 0:
            raise ValueError(f"{PREFIX}{suffix} must be positive, got {get(suffix)}")
    if get("lookup_refresh_interval") < 0:
        raise ValueError(
            f"{PREFIX}lookup_refresh_interval must be >= 0, got {get('lookup_refresh_interval')}"
        )
    urls = _parse_server_urls(PREFIX + "server_urls", values.get("server_urls"))
    if urls is None:
        urls = [f"{ensure_transport_scheme(get('host'))}:{port}"]

    mode_value = values.get("mp_transfer_mode") or env.get(ENV_MP_TRANSFER_MODE, "") or "auto"
    try:
        mode = MPTransferMode.parse(mode_value)
    except ValueError as exc:
        source = (
            PREFIX + "mp_transfer_mode" if "mp_transfer_mode" in values else ENV_MP_TRANSFER_MODE
        )
        raise ValueError(f"{source}: {exc}") from None

    max_offload = extra.get(MAX_OFFLOAD_TOKENS_KEY)
    if max_offload is not None:
        max_offload = _coerce_number(MAX_OFFLOAD_TOKENS_KEY, max_offload, int)
        if max_offload < 0:
            raise ValueError(f"{MAX_OFFLOAD_TOKENS_KEY} must be >= 0, got {max_offload}")
    if get("heartbeat_interval") > get("mq_timeout"):
        logger.warning(
            "%sheartbeat_interval (%s s) exceeds %smq_timeout (%s s)",
            PREFIX,
            get("heartbeat_interval"),
            PREFIX,
            get("mq_timeout"),
        )
    _check_autostart(values, urls)
    curve = client_keys_from_files(
        get("curve_secret_key_file"),
        get("curve_server_key_file"),
        f"{PREFIX}curve_secret_key_file / {PREFIX}curve_server_key_file",
    )
    return MPConnectorConfig(
        curve=curve,
        lazy_offload=_lazy_offload_config(get) if get("lazy_offload") else None,
        server_placement=_server_placement(get("server_placement")),
        server_urls=tuple(urls),
        mq_timeout=float(get("mq_timeout")),
        heartbeat_interval=float(get("heartbeat_interval")),
        nonblocking_lookup_status=bool(get("nonblocking_lookup_status")),
        mp_transfer_mode=mode,
        isolated_ipc=bool(get("isolated_ipc")),
        hash_algorithm=str(get("hash_algorithm")),
        eager_prefetch=bool(get("eager_prefetch")),
        save_decode_cache=bool(get("save_decode_cache")),
        async_load=bool(get("async_load")),
        lookup_refresh_interval=float(get("lookup_refresh_interval")),
        max_offload_tokens=max_offload,
        port=int(port),
        autostart=bool(get("autostart")),
        autostart_server_args=tuple(get("autostart.server_args")),
        autostart_wait_timeout=float(get("autostart.wait_timeout")),
    )


def _server_placement(value: str) -> str:
    placement = value.lower()
    if placement not in PLACEMENTS:
        raise ValueError(
            f"{PREFIX}server_placement must be one of {', '.join(PLACEMENTS)}, got {value!r}"
        )
    return placement


def _lazy_offload_config(get: Callable[[str], Any]) -> LazyOffloadConfig:
    name = str(get("lazy_offload_policy")).upper()
    try:
        policy = LazyOffloadPolicy(name)
    except ValueError:
        known = ", ".join(p.value for p in LazyOffloadPolicy)
        raise ValueError(
            f"{PREFIX}lazy_offload_policy must be one of {known}, got {name!r}"
        ) from None
    return LazyOffloadConfig(
        policy=policy,
        threshold=int(get("lazy_offload_threshold")),
        select_count=int(get("lazy_offload_select_count")),
        horizon_steps=float(get("lazy_offload_horizon_steps")),
        max_drain_per_step=int(get("lazy_offload_max_drain_per_step")),
        max_deferral_seconds=float(get("lazy_offload_max_deferral_seconds")),
    )


def _check_autostart(values: Mapping[str, Any], urls: list[str]) -> None:
    """Autostart settings are checked at start-up, before anything is launched."""
    from lmcache.integration.vllm.autostart import check_server_args, local_host_port

    wait = values.get("autostart.wait_timeout", DEFAULT_WAIT_TIMEOUT)
    if wait <= 0:
        raise ValueError(f"{PREFIX}autostart.wait_timeout must be positive, got {wait}")
    check_server_args(values.get("autostart.server_args", ()))
    if values.get("autostart"):
        if len(urls) != 1:
            raise ValueError(f"{PREFIX}autostart starts one server; got server_urls {urls}")
        local_host_port(urls[0])


def kv_events_enabled(vllm_config: Any) -> bool:
    """Whether the connector reports LMCache's KV events to vLLM: upstream's switch is
    vLLM's own ``--kv-events-config '{"enable_kv_cache_events": true, ...}'``
    (``vllm_config.kv_events_config.enable_kv_cache_events``), not a connector key."""
    events_config = getattr(vllm_config, "kv_events_config", None)
    return bool(getattr(events_config, "enable_kv_cache_events", False))
