"""Remote tier on Redis (RESP): one node or a Redis Cluster, shared by many servers.

Each chunk is one Redis string: the disk tier's chunk format (see
:mod:`lmcache.v1.storage_backend.local_disk_backend`: ``LMCD`` prefix, version, checksum
algorithm, JSON header with key, shapes, dtypes and memory format, XXH3-64 -- or CRC-32 --
sums of header and payload) followed by the raw bytes.  Nothing is pickled.  A value whose
checksum, length or embedded key does not match is a miss and is deleted.

Redis key: ``<namespace>:{<chunk hash>}:<CacheEngineKey string>``.  The braces are a
Redis Cluster hash tag: every key of one chunk (all workers, all layers) lands in one
slot, and a chunk's value is a single key, so it never spans slots.

Every batch is one pipeline: a prefix lookup of N keys is N ``EXISTS`` in one round trip
(one per shard in cluster mode; the prefix is computed over the merged answers), gets are
one ``MGET`` (per-shard ``GET`` pipelines in cluster mode), puts are ``SET NX [PX ttl]``
pipelines run on a small thread pool.  Round trips are counted by the connections
themselves (:attr:`RedisBackend.stats`).

Failures never reach the caller: while Redis is unreachable lookups and gets are misses and
puts are dropped and counted; the tier probes again every ``retry_interval_s`` and resumes
on its own.  At start an unreachable Redis is an error, or a warning when ``optional``.

Configuration: :class:`RedisSettings` (``extra_config["storage_plugin.redis.<option>"]``,
``remote_url``, or the server's ``--l2-adapter '{"type": "resp", ...}'`` JSON).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

import torch

from lmcache.utils import CacheEngineKey, str_to_dtype
from lmcache.v1.config import LMCacheEngineConfig, LMCacheMetadata
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.memory.format import MemoryFormat, part_offsets
from lmcache.v1.storage_backend.abstract_backend import (
    AllocatorBackendInterface,
    StoragePluginInterface,
)
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import (
    CorruptFileError,
    allocate_for_read,
    encode_header,
    encode_prefix,
    read_header,
)

logger = logging.getLogger(__name__)

URL_SCHEMES = ("redis", "rediss", "unix")
L2_ADAPTER_TYPES = ("resp", "redis", "valkey")
"""``--l2-adapter`` ``type`` values served by this backend (upstream: ``resp``, ``valkey``)."""
OPTION_PREFIX = "storage_plugin.redis."


_UNREACHED = object()
"""A put's answer for a key whose cluster shard could not be reached."""


class RedisUnavailableError(ConnectionError):
    """Redis could not be reached when the tier started (and the tier is not optional)."""


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
    """While Redis is down, calls are misses without network I/O; probe again this often."""
    username: str | None = None
    password: str | None = None
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_cert_reqs: str = "required"
    put_workers: int = 2
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
        if self.max_connections < 1 or self.put_workers < 1 or self.max_batch_bytes < 1:
            raise ValueError("redis max_connections, put_workers, max_batch_bytes must be >= 1")

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


@dataclass
class RedisStats:
    """Counters of one backend (read with :meth:`RedisBackend.get_stats`)."""

    round_trips: int = 0
    puts: int = 0
    put_bytes: int = 0
    puts_dropped: int = 0
    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    errors: int = 0
    outages: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "_lock"}


class _Availability:
    """Circuit breaker: after a connection failure, calls skip Redis until the next probe."""

    def __init__(self, retry_interval_s: float, stats: RedisStats, what: str = "tier") -> None:
        self._interval = retry_interval_s
        self._stats = stats
        self._what = what
        self._lock = threading.Lock()
        self._down = False
        self._next_probe = 0.0

    @property
    def is_up(self) -> bool:
        return not self._down

    def allow(self) -> bool:
        """True if a call may go to Redis (up, or it is time for one probe)."""
        if not self._down:
            return True
        with self._lock:
            now = time.monotonic()
            if now < self._next_probe:
                return False
            self._next_probe = now + self._interval  # one prober per interval
            return True

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            if not self._down:
                self._down = True
                self._stats.add(outages=1)
                logger.warning(
                    "redis %s unavailable (%s: %s): lookups miss and puts are dropped "
                    "until it is back (probing every %.1fs)",
                    self._what,
                    type(exc).__name__,
                    exc,
                    self._interval,
                )
            self._next_probe = time.monotonic() + self._interval

    def succeeded(self) -> None:
        if self._down:
            with self._lock:
                if self._down:
                    self._down = False
                    logger.warning("redis %s is reachable again; resumed", self._what)


# -- value format ---------------------------------------------------------------------------


def _encode_parts(key: CacheEngineKey, obj: MemoryObj) -> tuple[bytes, memoryview]:
    """``(prefix + header, payload)`` of ``obj`` in the disk tier's chunk format."""
    header = json.dumps(encode_header(key, obj)).encode("utf-8")
    payload = obj.byte_array
    return encode_prefix(header, payload) + header, payload


def encode_value(key: CacheEngineKey, obj: MemoryObj) -> bytes:
    """The stored value of ``obj`` as one new buffer."""
    head, payload = _encode_parts(key, obj)
    return b"".join((head, payload))


class _EncodeBuffer(threading.local):
    """A per-thread staging buffer, reused so puts do not fault in fresh pages each time."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def encode(self, items: Sequence[tuple[CacheEngineKey, MemoryObj]]) -> list[memoryview]:
        """Values of ``items`` as views into the buffer (valid until the next call)."""
        parts = [_encode_parts(key, obj) for key, obj in items]
        total = sum(len(head) + len(payload) for head, payload in parts)
        if len(self.buf) < total:
            self.buf = bytearray(total)  # a new one: the old may still be exported
        view = memoryview(self.buf)
        values = []
        offset = 0
        for head, payload in parts:
            end = offset + len(head) + len(payload)
            view[offset : offset + len(head)] = head
            view[offset + len(head) : end] = payload
            values.append(view[offset:end])
            offset = end
        return values


@dataclass
class DecodedValue:
    shapes: list[torch.Size]
    dtypes: list[torch.dtype]
    fmt: MemoryFormat
    used_size: int | None
    payload: memoryview


def decode_value(key: CacheEngineKey, value: bytes) -> DecodedValue:
    """Validate ``value`` as the entry of ``key``; raises :class:`CorruptFileError`."""
    header, payload_len, payload_sum = read_header(io.BytesIO(value), len(value))
    if header["key"] != key.to_string():
        raise CorruptFileError("key in header does not match")
    payload = memoryview(value)[len(value) - payload_len :]
    payload_sum.verify(payload)
    try:
        decoded = DecodedValue(
            shapes=[torch.Size(s) for s in header["shapes"]],
            dtypes=[str_to_dtype(d) for d in header["dtypes"]],
            fmt=MemoryFormat(header["fmt"]),
            used_size=header.get("used_size"),
            payload=payload,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptFileError(f"bad header: {exc}") from None
    expected = decoded.used_size
    if expected is None:
        expected = part_offsets(decoded.shapes, decoded.dtypes)[-1]
    if expected != payload_len:
        raise CorruptFileError("payload length does not match the header")
    return decoded


# -- connections ----------------------------------------------------------------------------


def _counting_connection_classes(stats: RedisStats) -> tuple[type, type, type, type]:
    """Connection classes (sync/async, plain/TLS) that count writes, i.e. round trips.

    Per backend, so counters are never shared between backends."""
    import redis.asyncio.connection as aconn
    import redis.connection as conn

    def sync_cls(base: Any) -> type:
        def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
            stats.add(round_trips=1)
            base.send_packed_command(self, command, check_health)

        return type(
            f"Counting{base.__name__}", (base,), {"send_packed_command": send_packed_command}
        )

    def async_cls(base: Any) -> type:
        async def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
            stats.add(round_trips=1)
            await base.send_packed_command(self, command, check_health)

        return type(
            f"Counting{base.__name__}", (base,), {"send_packed_command": send_packed_command}
        )

    return (
        sync_cls(conn.Connection),
        sync_cls(conn.SSLConnection),
        async_cls(aconn.Connection),
        async_cls(aconn.SSLConnection),
    )


class RedisBackend(StoragePluginInterface):
    """The Redis tier.  Reads allocate from ``local_cpu_backend`` (the L1 allocator)."""

    def __init__(
        self,
        dst_device: str = "cpu",
        config: LMCacheEngineConfig | None = None,
        metadata: LMCacheMetadata | None = None,
        local_cpu_backend: LocalCPUBackend | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        settings: RedisSettings | None = None,
    ) -> None:
        super().__init__(dst_device, config, metadata, local_cpu_backend, loop)
        try:
            import redis  # noqa: F401 - fail early with the install hint
        except ImportError:
            raise ImportError(
                "the Redis tier needs redis-py: pip install 'lmcache-core[redis]'"
            ) from None
        if settings is None:
            settings = RedisSettings.from_config(config or LMCacheEngineConfig())
        self.settings = settings
        self.stats = RedisStats()
        self._availability = _Availability(settings.retry_interval_s, self.stats)
        self._shard_breakers: dict[str, _Availability] = {}
        self._classes = _counting_connection_classes(self.stats)
        self._prefix = f"{settings.namespace}:"
        self._client_lock = threading.Lock()
        self._client: Any = None
        self._aclient: Any = None
        self._pins: dict[CacheEngineKey, int] = {}
        self._put_tasks: dict[CacheEngineKey, Future] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(
            max_workers=settings.put_workers, thread_name_prefix="lmc-redis-put"
        )
        self._encoder = _EncodeBuffer()
        self._closed = False
        self._connect_at_start()

    def __str__(self) -> str:
        mode = "cluster" if self.settings.cluster else "node"
        return f"RedisBackend({self.settings.redacted()['url']}, {mode})"

    # -- connection management ----------------------------------------------------------------

    def _client_kwargs(self, asynchronous: bool) -> dict[str, Any]:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        s = self.settings
        tls = urlsplit(s.url).scheme == "rediss"
        sync_plain, sync_tls, async_plain, async_tls = self._classes
        if asynchronous:
            connection_class = async_tls if tls else async_plain
            from redis.asyncio.retry import Retry as AsyncRetry

            retry: Any = AsyncRetry(NoBackoff(), 0)
        else:
            connection_class = sync_tls if tls else sync_plain
            retry = Retry(NoBackoff(), 0)
        kwargs: dict[str, Any] = {
            "socket_timeout": s.timeout_s,
            "socket_connect_timeout": s.connect_timeout_s,
            # Failures are handled by the circuit breaker; redis-py's own retries (with
            # backoff of up to seconds) would stall callers instead.
            "retry": retry,
            "connection_class": connection_class,
            "max_connections": s.max_connections,
        }
        if s.username is not None:
            kwargs["username"] = s.username
        if s.password is not None:
            kwargs["password"] = s.password
        if tls:
            kwargs.update(
                ssl_ca_certs=s.ssl_ca_certs,
                ssl_certfile=s.ssl_certfile,
                ssl_keyfile=s.ssl_keyfile,
                ssl_cert_reqs=s.ssl_cert_reqs,
            )
        return kwargs

    def _make_client(self) -> Any:
        import redis
        from redis.cluster import RedisCluster

        kwargs = self._client_kwargs(asynchronous=False)
        client: Any
        if self.settings.cluster:
            client = RedisCluster.from_url(self.settings.url, **kwargs)
        else:
            max_connections = kwargs.pop("max_connections")
            pool = redis.BlockingConnectionPool.from_url(
                self.settings.url,
                max_connections=max_connections,
                timeout=self.settings.timeout_s,
                **kwargs,
            )
            client = redis.Redis(connection_pool=pool)
        client.ping()
        return client

    def _get_client(self) -> Any:
        """The sync client, created on first use (or on a probe while Redis was down)."""
        client = self._client
        if client is not None:
            return client
        with self._client_lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _connect_at_start(self) -> None:
        import redis

        try:
            self._get_client()
        except (*_unreachable_errors(), redis.RedisError) as exc:  # type: ignore[misc]
            if not self.settings.optional:
                self._executor.shutdown(wait=False)
                raise RedisUnavailableError(
                    f"cannot reach Redis at {self.settings.redacted()['url']} "
                    f"({type(exc).__name__}: {exc}); set the tier optional to start without it"
                ) from exc
            self._availability.failed(exc)
        else:
            logger.info("redis tier connected: %s", self)

    def _run(self, op: Callable[[Any], Any], what: str) -> Any:
        """``op(client)`` unless Redis is known down; None (and breaker tripped) on failure."""
        import redis

        if self._closed or not self._availability.allow():
            return None
        try:
            result = op(self._get_client())
        except _unreachable_errors() as exc:
            self._on_connection_error(exc)
            return None
        except redis.RedisError as exc:
            self.stats.add(errors=1)
            logger.warning("redis %s failed: %s", what, exc)
            return None
        self._availability.succeeded()
        return result

    def _on_connection_error(self, exc: BaseException) -> None:
        self.stats.add(errors=1)
        self._availability.failed(exc)
        if self.settings.cluster:
            # A cluster client holds a slot map that may be stale once nodes come back.
            with self._client_lock:
                client, self._client = self._client, None
            if client is not None:
                try:
                    client.close()
                except Exception:
                    logger.debug("closing the stale cluster client failed", exc_info=True)

    def _shard_breaker(self, node: str) -> _Availability:
        with self._client_lock:
            breaker = self._shard_breakers.get(node)
            if breaker is None:
                breaker = _Availability(self.settings.retry_interval_s, self.stats, f"shard {node}")
                self._shard_breakers[node] = breaker
            return breaker

    @staticmethod
    def _shards(client: Any, names: list[str]) -> dict[str, list[int]]:
        """Indices of ``names`` grouped by the cluster node that owns their slot."""
        groups: dict[str, list[int]] = {}
        for index, name in enumerate(names):
            node = client.nodes_manager.get_node_from_slot(client.keyslot(name))
            groups.setdefault(node.name, []).append(index)
        return groups

    def _run_sharded(
        self,
        names: list[str],
        op: Callable[[Any, list[int]], list[Any]],
        what: str,
        unreached: Any = None,
    ) -> list[Any] | None:
        """Cluster mode: ``op(client, indices)`` once per shard.  A shard that cannot be
        reached answers ``unreached`` for its keys and is skipped until its own next probe;
        the other shards keep answering (one dead or hung node is not a dead tier)."""
        import redis

        if self._closed or not self._availability.allow():
            return None
        try:
            client = self._get_client()
            shards = self._shards(client, names)
        except _unreachable_errors() as exc:
            self._on_connection_error(exc)
            return None
        except redis.RedisError as exc:
            self.stats.add(errors=1)
            logger.warning("redis %s failed: %s", what, exc)
            return None
        self._availability.succeeded()
        answers: list[Any] = [unreached] * len(names)
        for node, indices in shards.items():
            breaker = self._shard_breaker(node)
            if not breaker.allow():
                continue
            try:
                results = op(client, indices)
            except _unreachable_errors() as exc:
                self.stats.add(errors=1)
                breaker.failed(exc)
                continue
            except redis.RedisError as exc:
                self.stats.add(errors=1)
                logger.warning("redis %s on shard %s failed: %s", what, node, exc)
                continue
            breaker.succeeded()
            for index, result in zip(indices, results):
                answers[index] = result
        return answers

    @property
    def available(self) -> bool:
        """False while Redis is known to be unreachable."""
        return self._availability.is_up

    def get_stats(self) -> dict[str, int]:
        return self.stats.snapshot()

    # -- keys ---------------------------------------------------------------------------------

    def redis_key(self, key: CacheEngineKey) -> str:
        """Redis key of ``key``; the ``{chunk hash}`` hash tag keeps a chunk in one slot."""
        return f"{self._prefix}{{{key.chunk_hash_hex}}}:{key.to_string()}"

    # -- lookups ------------------------------------------------------------------------------

    def _exists_pipeline(self, client: Any, names: list[str]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.exists(name)
        return list(pipe.execute(raise_on_error=False))

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        """Leading stored keys: N ``EXISTS`` in one pipeline (one round trip per shard)."""
        if not keys:
            return 0
        names = [self.redis_key(k) for k in keys]
        if self.settings.cluster:
            answers = self._run_sharded(
                names, lambda c, idx: self._exists_pipeline(c, [names[i] for i in idx]), "lookup"
            )
        else:
            answers = self._run(lambda c: self._exists_pipeline(c, names), "lookup")
        return self._prefix_hits(keys, answers, pin)

    def _prefix_hits(self, keys: list[CacheEngineKey], answers: list[Any] | None, pin: bool) -> int:
        if answers is None:
            return 0
        hits = 0
        for answer in answers:
            if not (isinstance(answer, int) and answer > 0):
                break
            hits += 1
        if pin and hits:
            with self._lock:
                for key in keys[:hits]:
                    self._pins[key] = self._pins.get(key, 0) + 1
        return hits

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        return self.batched_contains([key], pin=pin) == 1

    # -- gets ---------------------------------------------------------------------------------

    def _fetch(self, client: Any, names: list[str]) -> list[Any]:
        if not self.settings.cluster:
            return list(client.mget(names))
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.get(name)
        return list(pipe.execute(raise_on_error=False))

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        return self.batched_get_blocking([key])[0]

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        if not keys:
            return []
        self._wait_for_pending(keys)
        names = [self.redis_key(k) for k in keys]
        if self.settings.cluster:
            values = self._run_sharded(
                names, lambda c, idx: self._fetch(c, [names[i] for i in idx]), "get"
            )
        else:
            values = self._run(lambda c: self._fetch(c, names), "get")
        return self._materialize(keys, values)

    def _materialize(
        self, keys: list[CacheEngineKey], values: list[Any] | None
    ) -> list[MemoryObj | None]:
        if values is None:
            self.stats.add(misses=len(keys))
            return [None] * len(keys)
        results: list[MemoryObj | None] = []
        corrupt: list[str] = []
        for key, value in zip(keys, values):
            obj = None
            if isinstance(value, bytes):
                try:
                    obj = self._to_memory_obj(decode_value(key, value))
                except CorruptFileError as exc:
                    logger.warning("corrupt redis value for %s (%s): deleted", key, exc)
                    corrupt.append(self.redis_key(key))
            results.append(obj)
        hits = sum(obj is not None for obj in results)
        self.stats.add(hits=hits, misses=len(keys) - hits, corrupt=len(corrupt))
        if corrupt:
            self._run(lambda c: self._delete_names(c, corrupt), "delete")
        return results

    def _to_memory_obj(self, value: DecodedValue) -> MemoryObj | None:
        obj = allocate_for_read(self.local_cpu_backend, value.shapes, value.dtypes, value.fmt)
        if obj is None:
            logger.warning("no memory to read a %d-byte chunk from redis", len(value.payload))
            return None
        if value.used_size is not None:
            obj.set_used_size(int(value.used_size))
        obj.byte_array[:] = value.payload
        return obj

    # -- asyncio path -------------------------------------------------------------------------

    def _make_async_client(self) -> Any:
        import redis.asyncio as aredis
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

        kwargs = self._client_kwargs(asynchronous=True)
        if self.settings.cluster:
            kwargs.pop("max_connections")
            return AsyncRedisCluster.from_url(self.settings.url, **kwargs)
        return aredis.Redis.from_url(self.settings.url, **kwargs)

    async def _run_async(self, op: Callable[[Any], Any], what: str) -> Any:
        """Async twin of :meth:`_run`.  A client is kept for ``loop`` (the server's event
        loop); on any other loop a client lives for one call, as its connections are bound
        to the loop that opened them."""
        import redis

        if self._closed or not self._availability.allow():
            return None
        persistent = self.loop is not None and asyncio.get_running_loop() is self.loop
        client = self._aclient if persistent else None
        try:
            if client is None:
                client = self._make_async_client()
                if persistent:
                    self._aclient = client
            result = await op(client)
        except _unreachable_errors() as exc:
            self._on_connection_error(exc)
            if persistent:
                self._aclient = None
                await _aclose_quietly(client)
            return None
        except redis.RedisError as exc:
            self.stats.add(errors=1)
            logger.warning("redis %s failed: %s", what, exc)
            return None
        finally:
            if not persistent and client is not None:
                await _aclose_quietly(client)
        self._availability.succeeded()
        return result

    async def batched_async_contains(
        self, lookup_id: str, keys: list[CacheEngineKey], pin: bool = False
    ) -> int:
        if not keys:
            return 0
        names = [self.redis_key(k) for k in keys]

        async def op(client: Any) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.exists(name)
            return list(await pipe.execute(raise_on_error=False))

        return self._prefix_hits(keys, await self._run_async(op, "lookup"), pin)

    async def batched_get_non_blocking(
        self, lookup_id: str, keys: list[CacheEngineKey], transfer_spec: Any = None
    ) -> list[MemoryObj]:
        if not keys:
            return []
        names = [self.redis_key(k) for k in keys]

        async def op(client: Any) -> list[Any]:
            if not self.settings.cluster:
                return list(await client.mget(names))
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.get(name)
            return list(await pipe.execute(raise_on_error=False))

        results = self._materialize(keys, await self._run_async(op, "get"))
        objs: list[MemoryObj] = []
        for obj in results:
            if obj is None:
                break
            objs.append(obj)
        for obj in results[len(objs) :]:
            if obj is not None:
                obj.ref_count_down()
        return objs

    # -- puts ---------------------------------------------------------------------------------

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        with self._lock:
            return key in self._put_tasks

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future] | None:
        """Queue ``SET NX`` pipelines; futures never raise (failed puts are counted)."""
        if len(keys) != len(objs):
            raise ValueError(f"{len(keys)} keys but {len(objs)} objects")
        futures: list[Future] = []
        for batch in _batches(list(zip(keys, objs)), self.settings.max_batch_bytes):
            with self._lock:
                batch = [(k, o) for k, o in batch if k not in self._put_tasks]
                if not batch:
                    continue
                for _, obj in batch:
                    obj.ref_count_up()  # released once the value is encoded
                future = self._executor.submit(self._put_batch, batch, on_complete_callback)
                for key, _ in batch:
                    self._put_tasks[key] = future
            futures.append(future)
        return futures

    def _put_batch(
        self,
        batch: list[tuple[CacheEngineKey, MemoryObj]],
        on_complete_callback: Callable[[CacheEngineKey], None] | None,
    ) -> None:
        keys = [key for key, _ in batch]
        values: list[memoryview] = []
        try:
            try:
                values = self._encoder.encode(batch)
            finally:
                for _, obj in batch:
                    obj.ref_count_down()
            stored = self._store(keys, values)
        except Exception:
            logger.exception("redis put of %d chunks failed", len(keys))
            stored = None
        finally:
            with self._lock:
                for key in keys:
                    self._put_tasks.pop(key, None)
        if stored is None:
            self.stats.add(puts_dropped=len(keys))
            return
        landed = [i for i, answer in enumerate(stored) if answer is not _UNREACHED]
        self.stats.add(
            puts=len(landed),
            puts_dropped=len(keys) - len(landed),
            put_bytes=sum(len(values[i]) for i in landed),
        )
        if on_complete_callback is not None:
            for i in landed:
                on_complete_callback(keys[i])

    def _store(self, keys: list[CacheEngineKey], values: list[memoryview]) -> list[Any] | None:
        """SET NX answers per key (:data:`_UNREACHED` for a cluster shard that is down);
        None if nothing could be stored."""
        ttl_ms = int(self.settings.ttl_s * 1000) if self.settings.ttl_s is not None else None
        names = [self.redis_key(key) for key in keys]

        def op(client: Any, indices: Sequence[int]) -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for i in indices:
                # NX: the first value of a key wins (keys name content, so a second
                # writer has nothing new to say) and readers never see a value change.
                pipe.set(names[i], values[i], nx=True, px=ttl_ms)
            answers = list(pipe.execute(raise_on_error=False))
            failed = [a for a in answers if isinstance(a, Exception)]
            if failed:
                raise failed[0]
            return answers

        if self.settings.cluster:
            return self._run_sharded(names, op, "put", unreached=_UNREACHED)
        return self._run(lambda c: op(c, range(len(keys))), "put")  # type: ignore[no-any-return]

    def _wait_for_pending(self, keys: list[CacheEngineKey]) -> None:
        with self._lock:
            pending = {id(f): f for k in keys if (f := self._put_tasks.get(k)) is not None}
        for future in pending.values():
            future.exception()

    def wait_for_puts(self) -> None:
        """Block until every submitted put has finished (tests, shutdown, benchmarks)."""
        with self._lock:
            pending = {id(f): f for f in self._put_tasks.values()}
        for future in pending.values():
            future.exception()

    # -- pins and removal ---------------------------------------------------------------------

    def pin(self, key: CacheEngineKey) -> bool:
        """Pins are local to this process: they stop :meth:`remove` without ``force``;
        Redis itself may still expire (TTL) or evict (maxmemory) the entry."""
        return self.contains(key, pin=True)

    def unpin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            count = self._pins.get(key, 0)
            if count == 0:
                return False
            if count == 1:
                del self._pins[key]
            else:
                self._pins[key] = count - 1
            return True

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        return self.batched_remove([key], force=force) == 1

    def batched_remove(self, keys: list[CacheEngineKey], force: bool = True) -> int:
        self._wait_for_pending(keys)
        with self._lock:
            if not force:
                keys = [k for k in keys if not self._pins.get(k)]
            for key in keys:
                self._pins.pop(key, None)
        if not keys:
            return 0
        names = [self.redis_key(k) for k in keys]
        answers = self._run(lambda c: self._delete_names(c, names), "delete")
        return sum(int(a) for a in answers or [] if isinstance(a, int))

    @staticmethod
    def _delete_names(client: Any, names: list[str]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.delete(name)
        return list(pipe.execute(raise_on_error=False))

    # -- misc ---------------------------------------------------------------------------------

    def get_allocator_backend(self) -> AllocatorBackendInterface:
        if self.local_cpu_backend is None:
            raise RuntimeError("RedisBackend was built without a LocalCPUBackend")
        return self.local_cpu_backend

    def close(self) -> None:
        if self._closed:
            return
        self.wait_for_puts()
        self._closed = True
        self._executor.shutdown(wait=True)
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                logger.debug("closing the redis client failed", exc_info=True)
        aclient, self._aclient = self._aclient, None
        if aclient is not None and self.loop is not None and not self.loop.is_closed():
            if self.loop.is_running():
                asyncio.run_coroutine_threadsafe(_aclose_quietly(aclient), self.loop)
            else:
                self.loop.run_until_complete(_aclose_quietly(aclient))


def _batches(
    items: list[tuple[CacheEngineKey, MemoryObj]], max_bytes: int
) -> Iterator[list[tuple[CacheEngineKey, MemoryObj]]]:
    batch: list[tuple[CacheEngineKey, MemoryObj]] = []
    size = 0
    for item in items:
        nbytes = item[1].get_size()
        if batch and size + nbytes > max_bytes:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += nbytes
    if batch:
        yield batch


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    """Errors meaning "Redis (or a shard) cannot be reached": they trip the breaker."""
    import redis
    from redis.exceptions import ClusterError, RedisClusterException

    return (
        redis.ConnectionError,
        redis.TimeoutError,
        ClusterError,
        RedisClusterException,
        OSError,
        asyncio.TimeoutError,
    )


async def _aclose_quietly(client: Any) -> None:
    try:
        await client.aclose()
    except Exception:
        logger.debug("closing an async redis client failed", exc_info=True)


def create_from_l2_adapter(
    spec: str | Mapping[str, Any],
    local_cpu_backend: LocalCPUBackend | None = None,
    *,
    config: LMCacheEngineConfig | None = None,
    metadata: LMCacheMetadata | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
    dst_device: str = "cpu",
) -> RedisBackend:
    """The Redis tier from upstream's ``--l2-adapter`` JSON (``type`` ``resp``, ``redis`` or
    ``valkey``).  Raises ``ValueError`` for a bad spec and :class:`RedisUnavailableError`
    when Redis is unreachable and the spec does not say ``"optional": true``."""
    return RedisBackend(
        dst_device=dst_device,
        config=config,
        metadata=metadata,
        local_cpu_backend=local_cpu_backend,
        loop=loop,
        settings=RedisSettings.from_l2_adapter(spec),
    )


def is_redis_url(url: str | None) -> bool:
    return url is not None and urlsplit(url).scheme in ("redis", "rediss")
