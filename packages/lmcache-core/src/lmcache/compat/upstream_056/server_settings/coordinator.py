"""Upstream LMCache 0.5.6's coordinator settings: ``CoordinatorConfig`` and its flags.

Upstream's MP server can join a fleet coordinator (register, heartbeat, stream cache events
over HTTP or Kafka, ask it for fleet-wide CacheBlend matches).  **This server has no
coordinator client**: the types, flags and validation here exist so code and deployments
written for upstream's ``lmcache.v1.multiprocess.config`` parse the same way (same names,
defaults, environment fallbacks and errors), and ``lmcache server`` logs a warning when a
setting here would have turned something on (:func:`coordinator_settings_in_use`).

Precedence for the registration settings: flag > deprecated pre-0.5.3 flag spelling >
``LMCACHE_COORDINATOR_*`` environment variable > default.  The event-transport and blend
settings come from flags only.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
from typing import TypeVar

__all__ = [
    "DEFAULT_COORDINATOR_CONFIG",
    "DEFAULT_KAFKA_CACHE_EVENT_TOPIC",
    "DEFAULT_KAFKA_DELIVERY_TIMEOUT",
    "CacheEventSinkConfig",
    "CoordinatorConfig",
    "HttpCacheEventSinkConfig",
    "KafkaCacheEventSinkConfig",
    "add_coordinator_args",
    "coordinator_settings_in_use",
    "parse_args_to_coordinator_config",
]

# Deprecation warnings are part of upstream's ``lmcache.v1.multiprocess.config`` API, and
# deployers filter that logger's records; this module is where those functions live here.
logger = logging.getLogger("lmcache.v1.multiprocess.config")

DEFAULT_KAFKA_CACHE_EVENT_TOPIC = "lmcache-cache-events"
DEFAULT_KAFKA_DELIVERY_TIMEOUT = 300.0

_DEFAULT_HEARTBEAT_INTERVAL = 5.0
_DEFAULT_EVENT_FLUSH_INTERVAL = 1.0
_DEFAULT_BLEND_TIMEOUT = 1.0
_DEFAULT_BLEND_MATCH_CONCURRENCY = 8
_TRUE_WORDS = ("1", "true", "yes")

T = TypeVar("T")


def _finite_positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


@dataclasses.dataclass(frozen=True)
class HttpCacheEventSinkConfig:
    """Cache events posted to the coordinator over HTTP (upstream's default; no settings)."""


@dataclasses.dataclass(frozen=True)
class KafkaCacheEventSinkConfig:
    """Cache events published to a Kafka topic; validated on construction."""

    bootstrap_servers: str
    topic: str = DEFAULT_KAFKA_CACHE_EVENT_TOPIC
    delivery_timeout: float = DEFAULT_KAFKA_DELIVERY_TIMEOUT

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ValueError("Kafka bootstrap servers must be non-empty")
        if not self.topic.strip():
            raise ValueError("Kafka cache-event topic must be non-empty")
        if not _finite_positive(self.delivery_timeout):
            raise ValueError(
                f"Kafka delivery timeout must be a finite number > 0, got {self.delivery_timeout}"
            )


CacheEventSinkConfig = HttpCacheEventSinkConfig | KafkaCacheEventSinkConfig


@dataclasses.dataclass
class CoordinatorConfig:
    """Joining an MP coordinator; an empty ``url`` (the default) means no coordinator."""

    url: str = ""
    advertise_ip: str = ""
    heartbeat_interval: float = _DEFAULT_HEARTBEAT_INTERVAL
    event_reporting: bool = False
    event_flush_interval: float = _DEFAULT_EVENT_FLUSH_INTERVAL
    event_sink_config: CacheEventSinkConfig = dataclasses.field(
        default_factory=HttpCacheEventSinkConfig
    )
    blend_timeout: float = _DEFAULT_BLEND_TIMEOUT
    blend_match_concurrency: int = _DEFAULT_BLEND_MATCH_CONCURRENCY


DEFAULT_COORDINATOR_CONFIG = CoordinatorConfig()


def add_coordinator_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add upstream's ``--coordinator-*`` flags (values are checked when parsed to a config)."""
    group = parser.add_argument_group(
        "Coordinator (upstream; not used by this server)",
        "Accepted for compatibility with upstream deployments; this server has no "
        "coordinator client and logs a warning when one of these would take effect.",
    )
    group.add_argument(
        "--coordinator-url",
        default=None,
        help="Coordinator base URL (upstream: register and heartbeat there). "
        "Default LMCACHE_COORDINATOR_URL, else none.",
    )
    group.add_argument(
        "--coordinator-advertise-ip",
        default=None,
        help="IP the coordinator should reach this server at. "
        "Default LMCACHE_COORDINATOR_ADVERTISE_IP.",
    )
    group.add_argument(
        "--coordinator-heartbeat-interval",
        type=float,
        default=None,
        help="Seconds between heartbeats (> 0). Default "
        f"LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL, else {_DEFAULT_HEARTBEAT_INTERVAL}.",
    )
    group.add_argument(
        "--coordinator-event-reporting",
        action="store_true",
        default=None,
        help="Stream cache events to the coordinator. "
        "Default LMCACHE_COORDINATOR_EVENT_REPORTING, else off.",
    )
    group.add_argument(
        "--coordinator-event-flush-interval",
        type=float,
        default=None,
        help="Seconds between cache-event flushes (> 0). Default "
        f"LMCACHE_COORDINATOR_EVENT_FLUSH_INTERVAL, else {_DEFAULT_EVENT_FLUSH_INTERVAL}.",
    )
    group.add_argument(
        "--coordinator-event-transport",
        choices=("http", "kafka"),
        default="http",
        help="How cache events travel: http (to the coordinator) or kafka.",
    )
    group.add_argument(
        "--coordinator-kafka-bootstrap-servers",
        default="",
        help="Comma-separated Kafka bootstrap servers (required with kafka).",
    )
    group.add_argument(
        "--coordinator-kafka-topic",
        default=DEFAULT_KAFKA_CACHE_EVENT_TOPIC,
        help="Kafka topic of the cache events.",
    )
    group.add_argument(
        "--coordinator-kafka-delivery-timeout",
        type=float,
        default=DEFAULT_KAFKA_DELIVERY_TIMEOUT,
        help="Seconds Kafka retries a cache event before dropping it (> 0).",
    )
    group.add_argument(
        "--coordinator-blend-timeout",
        type=float,
        default=_DEFAULT_BLEND_TIMEOUT,
        help="Seconds a fleet CacheBlend lookup may take (> 0).",
    )
    group.add_argument(
        "--coordinator-blend-match-concurrency",
        type=int,
        default=_DEFAULT_BLEND_MATCH_CONCURRENCY,
        help="Fleet CacheBlend match requests in flight at once (>= 1).",
    )
    # Spellings from before upstream 0.5.3, still rendered by older deployers (operator
    # <= 0.5.2): accepted and hidden, so such a pod does not fail on an unknown flag.
    group.add_argument(
        "--coordinator-l2-event-reporting",
        action="store_true",
        default=None,
        help=argparse.SUPPRESS,
    )
    group.add_argument(
        "--coordinator-l2-event-flush-interval",
        type=float,
        default=None,
        help=argparse.SUPPRESS,
    )
    return parser


def _env_float(name: str, default: float) -> float:
    raw = os.getenv(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} is not a number: {raw!r}") from None


def _pick(new: T | None, deprecated: T | None, old_flag: str, new_flag: str) -> T | None:
    """The new flag's value, else the deprecated spelling's (with a warning), else None."""
    if new is not None:
        return new
    if deprecated is not None:
        logger.warning("%s is deprecated, use %s instead", old_flag, new_flag)
        return deprecated
    return None


def parse_args_to_coordinator_config(args: argparse.Namespace) -> CoordinatorConfig:
    """Build a :class:`CoordinatorConfig` from the flags and the environment.

    Raises ``ValueError`` for a non-positive or non-finite interval or timeout, a blend
    match concurrency below 1, a non-numeric environment value, or an incomplete Kafka sink.
    """
    url = args.coordinator_url
    if url is None:
        url = os.getenv("LMCACHE_COORDINATOR_URL", "")
    advertise_ip = args.coordinator_advertise_ip
    if advertise_ip is None:
        advertise_ip = os.getenv("LMCACHE_COORDINATOR_ADVERTISE_IP", "")

    heartbeat = args.coordinator_heartbeat_interval
    if heartbeat is None:
        heartbeat = _env_float(
            "LMCACHE_COORDINATOR_HEARTBEAT_INTERVAL", _DEFAULT_HEARTBEAT_INTERVAL
        )
    # inf would register once and never heartbeat again; nan sleeps undefinedly.
    if not _finite_positive(heartbeat):
        raise ValueError(
            f"coordinator heartbeat interval must be a finite number > 0, got {heartbeat}"
        )

    reporting = _pick(
        args.coordinator_event_reporting,
        getattr(args, "coordinator_l2_event_reporting", None),
        "--coordinator-l2-event-reporting",
        "--coordinator-event-reporting",
    )
    if reporting is None:
        reporting = os.getenv("LMCACHE_COORDINATOR_EVENT_REPORTING", "").lower() in _TRUE_WORDS

    flush = _pick(
        args.coordinator_event_flush_interval,
        getattr(args, "coordinator_l2_event_flush_interval", None),
        "--coordinator-l2-event-flush-interval",
        "--coordinator-event-flush-interval",
    )
    if flush is None:
        flush = _env_float(
            "LMCACHE_COORDINATOR_EVENT_FLUSH_INTERVAL", _DEFAULT_EVENT_FLUSH_INTERVAL
        )
    if not _finite_positive(flush):
        raise ValueError(
            f"coordinator event flush interval must be a finite number > 0, got {flush}"
        )

    sink: CacheEventSinkConfig = HttpCacheEventSinkConfig()
    if args.coordinator_event_transport == "kafka":
        sink = KafkaCacheEventSinkConfig(
            bootstrap_servers=args.coordinator_kafka_bootstrap_servers,
            topic=args.coordinator_kafka_topic,
            delivery_timeout=args.coordinator_kafka_delivery_timeout,
        )

    blend_timeout = args.coordinator_blend_timeout
    if not _finite_positive(blend_timeout):
        raise ValueError(
            f"coordinator blend timeout must be a finite number > 0, got {blend_timeout}"
        )
    concurrency = args.coordinator_blend_match_concurrency
    if concurrency < 1:
        raise ValueError(f"coordinator blend match concurrency must be >= 1, got {concurrency}")

    return CoordinatorConfig(
        url=url,
        advertise_ip=advertise_ip,
        heartbeat_interval=float(heartbeat),
        event_reporting=bool(reporting),
        event_flush_interval=float(flush),
        event_sink_config=sink,
        blend_timeout=float(blend_timeout),
        blend_match_concurrency=int(concurrency),
    )


def coordinator_settings_in_use(config: CoordinatorConfig) -> list[str]:
    """What ``config`` asks of a coordinator client (which this server does not have)."""
    in_use: list[str] = []
    if config.url:
        in_use.append(f"coordinator registration at {config.url} (--coordinator-url)")
    if config.event_reporting:
        in_use.append("cache-event reporting (--coordinator-event-reporting)")
    return in_use
