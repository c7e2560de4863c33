"""Prometheus metrics of one MP cache server (``prometheus-client``).

Every server owns a :class:`~prometheus_client.CollectorRegistry`; nothing is registered in
the library's global registry, so several servers can live in one process (tests).

Two kinds of metrics:

* Hot-path counters and histograms (requests, latency, bytes moved, lookup tokens) are
  updated by the handlers.  Labelled children are resolved once and cached, so an update
  is a dictionary lookup plus the client's own increment.  With ``--disable-metrics`` the
  server holds ``None`` instead of a :class:`ServerMetrics` and pays one ``is None`` test.
* Everything that is state (tier usage and capacity, evictions, pinned objects, errors of
  the disk and remote tiers, registered workers, hit rate) is read at scrape time by
  :class:`_StateCollector`, so it costs nothing between scrapes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

PREFIX = "lmcache_mp"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Requests span sub-millisecond lookups to multi-second transfers of large chunks.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

# ZAP mechanisms, and "handshake": a connection that failed before ZAP was asked.
_AUTH_MECHANISMS = frozenset({"CURVE", "NULL", "PLAIN", "GSSAPI", "handshake"})
_DISK_LOGGER = "lmcache.v1.storage_backend.local_disk_backend"

TOP_SALTS = 10
"""Per-tenant series are kept for this many salts per tier (the largest); the rest are
summed under :data:`OTHER_SALTS`, so a server with thousands of tenants still exposes a
bounded number of series."""
OTHER_SALTS = "__other__"
UNSALTED = "_default"
"""The label of the empty salt (unsalted traffic), as the ``/quota`` routes spell it."""


def bounded_salt_usage(usage: dict[str, int], top: int = TOP_SALTS) -> list[tuple[str, int]]:
    """(label, bytes) of the ``top`` salts holding the most bytes, then one
    :data:`OTHER_SALTS` entry with the rest (only when there is a rest)."""
    ranked = sorted(usage.items(), key=lambda item: (-item[1], item[0]))
    shown = [(salt or UNSALTED, used) for salt, used in ranked[:top]]
    rest = ranked[top:]
    if rest:
        shown.append((OTHER_SALTS, sum(used for _salt, used in rest)))
    return shown


class ServerMetrics:
    """The hot-path metrics; state metrics come from ``state`` at scrape time."""

    def __init__(self, state: Callable[[], dict[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            f"{PREFIX}_requests",
            "Requests handled, by operation and outcome (ok or the error code).",
            ["operation", "outcome"],
            registry=self.registry,
        )
        self._latency = Histogram(
            f"{PREFIX}_request_latency_seconds",
            "Time from dispatch to reply of a request, by operation.",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._stored = Counter(
            f"{PREFIX}_stored_bytes",
            "KV bytes stored into L1, by transfer mode and sub-path.",
            ["transfer_mode", "sub_path"],
            registry=self.registry,
        )
        self._retrieved = Counter(
            f"{PREFIX}_retrieved_bytes",
            "KV bytes retrieved from the cache, by transfer mode and sub-path.",
            ["transfer_mode", "sub_path"],
            registry=self.registry,
        )
        self._lookup_tokens = Counter(
            f"{PREFIX}_lookup_tokens",
            "Tokens looked up, by result (hit or miss).",
            ["result"],
            registry=self.registry,
        )
        # Labels are bounded: mechanisms are a fixed set, tenants come from --tenants-file.
        self._auth_refused = Counter(
            f"{PREFIX}_auth_refused",
            "Connections refused on the CURVE RPC port: by ZAP (its mechanism) or in the "
            "handshake (handshake).",
            ["mechanism"],
            registry=self.registry,
        )
        self._tenant_requests = Counter(
            f"{PREFIX}_tenant_requests",
            "Requests of each tenant (--tenants-file), by outcome (ok or the error code).",
            ["tenant", "outcome"],
            registry=self.registry,
        )
        self._tenant_bytes = Counter(
            f"{PREFIX}_tenant_bytes",
            "KV bytes each tenant stored or retrieved.",
            ["tenant", "direction"],
            registry=self.registry,
        )
        self._lookup_hit = self._lookup_tokens.labels("hit")
        self._lookup_miss = self._lookup_tokens.labels("miss")
        self._children: dict[tuple[str, ...], Any] = {}
        self._children_lock = threading.Lock()
        self.disk_errors = _LogCounter(_DISK_LOGGER)
        if state is not None:
            self.registry.register(_StateCollector(state, self))

    # -- hot path -----------------------------------------------------------------------------

    def _child(self, key: tuple[str, ...], make: Callable[[], Any]) -> Any:
        child = self._children.get(key)
        if child is None:
            with self._children_lock:
                child = self._children.get(key)
                if child is None:
                    child = make()
                    self._children[key] = child
        return child

    def observe_request(self, operation: str, outcome: str, seconds: float) -> None:
        self._child(
            ("r", operation, outcome), lambda: self._requests.labels(operation, outcome)
        ).inc()
        self._child(("l", operation), lambda: self._latency.labels(operation)).observe(seconds)

    def count_rejected(self, operation: str, outcome: str) -> None:
        """A request refused before dispatch (malformed, unknown, shutting down)."""
        self._child(
            ("r", operation, outcome), lambda: self._requests.labels(operation, outcome)
        ).inc()

    def count_auth_refused(self, mechanism: str) -> None:
        label = mechanism if mechanism in _AUTH_MECHANISMS else "other"
        self._child(("a", label), lambda: self._auth_refused.labels(label)).inc()

    def observe_tenant(self, tenant: str, outcome: str) -> None:
        self._child(
            ("t", tenant, outcome), lambda: self._tenant_requests.labels(tenant, outcome)
        ).inc()

    def add_tenant_bytes(self, tenant: str, direction: str, nbytes: int) -> None:
        self._child(
            ("tb", tenant, direction), lambda: self._tenant_bytes.labels(tenant, direction)
        ).inc(nbytes)

    def add_stored(self, mode: str, sub_path: str, nbytes: int) -> None:
        self._child(("s", mode, sub_path), lambda: self._stored.labels(mode, sub_path)).inc(nbytes)

    def add_retrieved(self, mode: str, sub_path: str, nbytes: int) -> None:
        self._child(("g", mode, sub_path), lambda: self._retrieved.labels(mode, sub_path)).inc(
            nbytes
        )

    def add_lookup(self, hit_tokens: int, miss_tokens: int) -> None:
        self._lookup_hit.inc(hit_tokens)
        self._lookup_miss.inc(miss_tokens)

    def lookup_tokens(self) -> tuple[float, float]:
        return self._lookup_hit._value.get(), self._lookup_miss._value.get()

    # -- exposition ---------------------------------------------------------------------------

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def close(self) -> None:
        self.disk_errors.detach()


class _LogCounter(logging.Handler):
    """Counts WARNING-and-above records of one logger.

    The disk tier reports failed writes and corrupt files only through its logger; counting
    them here keeps the storage layer free of any server concern.  The handler is attached
    for the server's lifetime and removed by :meth:`detach`.
    """

    def __init__(self, logger_name: str) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self._target = logging.getLogger(logger_name)
        self._target.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1

    def detach(self) -> None:
        # Not ``close``: ``logging.shutdown`` and ``dictConfig`` close every handler.
        self._target.removeHandler(self)


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)


def _tenant_families(state: dict[str, Any]) -> Iterator[Metric]:
    """Bytes per tenant and tier (bounded: :func:`bounded_salt_usage`), how many tenants
    each tier holds, and the quota of every tenant shown."""
    usage_by_tier: dict[str, dict[str, int]] = state.get("salt_usage", {})
    quotas: dict[str, int] = state.get("quotas", {})
    used = _gauge(
        "tenant_used_bytes",
        f"Bytes a tenant (cache_salt; {UNSALTED!r}: unsalted) holds in a tier; the "
        f"{TOP_SALTS} largest per tier, the rest summed as {OTHER_SALTS!r}.",
        ["tier", "cache_salt"],
    )
    tenants = _gauge("tenants", "Tenants (cache_salts) holding bytes in a tier.", ["tier"])
    limits = _gauge(
        "tenant_quota_bytes",
        "Byte quota of each tenant shown in tenant_used_bytes that has one.",
        ["cache_salt"],
    )
    shown_quotas: set[str] = set()
    for tier, usage in usage_by_tier.items():
        tenants.add_metric([tier], len(usage))
        for label, nbytes in bounded_salt_usage(usage):
            used.add_metric([tier, label], nbytes)
            salt = "" if label == UNSALTED else label
            if salt in quotas and label not in shown_quotas:
                shown_quotas.add(label)
                limits.add_metric([label], quotas[salt])
    yield from (used, tenants, limits)


class _StateCollector(Collector):
    """Reads the server's state (``state()``) when Prometheus scrapes."""

    def __init__(self, state: Callable[[], dict[str, Any]], metrics: ServerMetrics) -> None:
        self._state = state
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked: the families depend on the tiers configured

    def collect(self) -> Iterator[Metric]:
        try:
            state = self._state()
        except Exception:
            logger.exception("reading server state for metrics failed")
            return
        used = _gauge("tier_used_bytes", "Bytes held by a storage tier.", ["tier", "kind"])
        capacity = _gauge("tier_capacity_bytes", "Capacity of a storage tier.", ["tier", "kind"])
        objects = _gauge("tier_objects", "Objects held by a storage tier.", ["tier", "kind"])
        evictions = CounterMetricFamily(
            f"{PREFIX}_evictions", "Objects evicted to make room, by tier.", labels=["tier"]
        )
        errors = CounterMetricFamily(
            f"{PREFIX}_tier_errors", "Errors of the disk and remote tiers.", labels=["tier"]
        )
        for tier in state["tiers"]:
            labels = [tier["name"], tier["kind"]]
            used.add_metric(labels, tier["used_bytes"])
            if tier.get("capacity_bytes") is not None:
                capacity.add_metric(labels, tier["capacity_bytes"])
            if tier.get("objects") is not None:
                objects.add_metric(labels, tier["objects"])
            if tier.get("evictions") is not None:
                evictions.add_metric([tier["name"]], tier["evictions"])
            if tier.get("errors") is not None:
                errors.add_metric([tier["name"]], tier["errors"])
            elif tier["kind"] == "disk":
                errors.add_metric([tier["name"]], self._metrics.disk_errors.count)
        yield from (used, capacity, objects, evictions, errors)
        yield from _tenant_families(state)
        workers = _gauge("registered_workers", "Registered workers, by transfer mode.", ["mode"])
        for mode, count in state["workers"].items():
            workers.add_metric([mode], count)
        yield workers
        pinned = _gauge("pinned_objects", "Objects pinned by outstanding lookups.")
        pinned.add_metric([], state["pinned_objects"])
        yield pinned
        hit, miss = self._metrics.lookup_tokens()
        rate = _gauge("lookup_hit_rate", "Hit tokens / looked-up tokens since start (0 if none).")
        rate.add_metric([], hit / (hit + miss) if hit + miss else 0.0)
        yield rate
        up = _gauge("healthy", "1 when every storage tier passes its health check.")
        up.add_metric([], 1.0 if state.get("healthy", True) else 0.0)
        yield up
