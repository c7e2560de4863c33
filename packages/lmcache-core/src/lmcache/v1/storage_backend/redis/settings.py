"""Options of the Redis tier, from ``extra_config``, ``remote_url`` or ``--l2-adapter`` JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from lmcache.v1.config import LMCacheEngineConfig

URL_SCHEMES = ("redis", "rediss", "unix")
L2_ADAPTER_TYPES = ("resp", "redis", "valkey")
"""``--l2-adapter`` ``type`` values served by this backend (upstream: ``resp``, ``valkey``)."""
OPTION_PREFIX = "storage_plugin.redis."


@dataclass
class RedisSettings:
    """Options of the Redis tier (names as in ``extra_config`` and the adapter JSON)."""

    url: str = "redis://127.0.0.1:6379"
    """``redis://[user:password@]host:port[/db]``, ``rediss://`` (TLS) or ``unix://``."""
    cluster: bool = False
    """Use Redis Cluster; ``url`` names any one node (the others are discovered)."""
    namespace: str = "lmcache"
    """Key prefix: give each deployment (or model) its own to keep their entries apart."""
    ttl_s: float | None = None
    """Expire entries this many seconds after they were written; None keeps them."""
    connect_timeout_s: float = 1.0
    timeout_s: float = 2.0
    """Socket timeout of every command; bounds how long a hung Redis can stall a caller."""
    max_connections: int = 16
    """Pool size (per node in cluster mode); callers wait up to ``timeout_s`` for one."""
    optional: bool = False
    """Unreachable at start: warn and keep trying instead of failing."""
    retry_interval_s: float = 1.0
    """While Redis is down, calls are misses without network I/O; one call probes it again
    this long after the last failure (the others keep failing fast meanwhile)."""
    username: str | None = None
    password: str | None = None
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_cert_reqs: str = "required"
    put_workers: int = 2
    put_queue_chunks: int = 1024
    """Chunks queued or being written at most; a put past it is dropped (counted in
    ``puts_dropped`` and ``puts_queue_full``) rather than wait or hold more memory."""
    max_batch_bytes: int = 64 << 20
    """Puts are split into pipelines of at most this many value bytes."""

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in URL_SCHEMES:
            raise ValueError(
                f"redis url {self.url!r}: scheme must be one of {', '.join(URL_SCHEMES)}"
            )
        if self.cluster and scheme == "unix":
            raise ValueError("Redis Cluster needs a TCP url (redis:// or rediss://)")
        if not self.namespace or any(c in self.namespace for c in "{}"):
            raise ValueError(f"redis namespace {self.namespace!r} must be non-empty, no braces")
        for name in ("connect_timeout_s", "timeout_s", "retry_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"redis option {name} must be > 0")
        if self.ttl_s is not None and self.ttl_s <= 0:
            raise ValueError("redis option ttl_s must be > 0 (or unset)")
        if (
            min(self.max_connections, self.put_workers, self.max_batch_bytes, self.put_queue_chunks)
            < 1
        ):
            raise ValueError(
                "redis max_connections, put_workers, max_batch_bytes, put_queue_chunks must be >= 1"
            )

    @property
    def probe_timeout_s(self) -> float:
        """The longest a probe can take (a pooled connection, connect, one command); a
        probe not over by then is given up and another may go."""
        return self.connect_timeout_s + 2 * self.timeout_s + 1.0

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], source: str = "redis options"
    ) -> RedisSettings:
        """Settings from a mapping of option names (unknown names are an error)."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"{source}: unknown option(s) {unknown}; known: {sorted(known)}")
        return cls(**{name: _coerce(known[name].type, values[name]) for name in values})

    @classmethod
    def from_config(cls, config: LMCacheEngineConfig) -> RedisSettings:
        """``extra_config["storage_plugin.redis.<option>"]``; ``url`` defaults to
        ``remote_url``."""
        options = {
            k[len(OPTION_PREFIX) :]: v
            for k, v in (config.extra_config or {}).items()
            if k.startswith(OPTION_PREFIX)
        }
        options.pop("module_path", None)
        options.pop("class_name", None)
        if "url" not in options and config.remote_url:
            options["url"] = config.remote_url
        return cls.from_mapping(options, source="extra_config storage_plugin.redis.*")

    @classmethod
    def from_l2_adapter(cls, spec: str | Mapping[str, Any]) -> RedisSettings:
        """Upstream's ``--l2-adapter`` JSON: ``{"type": "resp", "url": ...}`` (or ``host`` and
        ``port`` instead of ``url``; other keys are :class:`RedisSettings` options)."""
        values = dict(json.loads(spec) if isinstance(spec, str) else spec)
        kind = values.pop("type", None)
        if kind not in L2_ADAPTER_TYPES:
            raise ValueError(f"l2 adapter type {kind!r} is not one of {L2_ADAPTER_TYPES}")
        host, port = values.pop("host", None), values.pop("port", None)
        if host is not None or port is not None:
            if "url" in values:
                raise ValueError("l2 adapter: give either url or host/port, not both")
            scheme = "rediss" if values.pop("tls", False) else "redis"
            values["url"] = f"{scheme}://{host or '127.0.0.1'}:{int(port or 6379)}"
        return cls.from_mapping(values, source=f"--l2-adapter {kind!r}")

    def redacted(self) -> dict[str, Any]:
        out = asdict(self)
        parts = urlsplit(self.url)
        if parts.password:
            out["url"] = self.url.replace(f":{parts.password}@", ":***@")
        if self.password:
            out["password"] = "***"
        return out


def _coerce(kind: Any, value: Any) -> Any:
    """Config values may come from YAML or env strings; convert to the field's type."""
    kind = str(kind)
    if value is None:
        return None
    if kind.startswith("bool"):
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)
    if kind.startswith("int"):
        return int(value)
    if kind.startswith("float"):
        return float(value)
    return value


def is_redis_url(url: str | None) -> bool:
    return url is not None and urlsplit(url).scheme in ("redis", "rediss")
