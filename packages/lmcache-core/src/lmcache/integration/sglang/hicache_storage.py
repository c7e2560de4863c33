"""SGLang HiCache's third tier (L3) in an ``lmcache server``: :class:`LMCacheHiCacheStorage`.

SGLang loads it with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "lmcache",
        "module_path": "lmcache.integration.sglang.hicache_storage",
        "class_name": "LMCacheHiCacheStorage", "interface_v1": 1,
        "lmcache_url": "tcp://127.0.0.1:5555"}'

SGLang names each KV page by a hash of its tokens (chained on the previous page's), and
its page size is not the server's chunk size, so a page cannot be one of the server's
token chunks.  Each page is stored as it is, a *named object* of the server
(``put_objects`` / ``get_objects`` / ``count_object_prefix``): the page hash is the name,
and an ``ObjectScope`` keeps ranks, tenants and page formats apart.  The bytes of a page
are the host pool's flat data page, as SGLang's own file backend writes them.

Every method answers within a bound and never raises for the server's sake: a request
without a reply in ``timeout_s`` (the server is down, or wedged) fails, and for
``retry_after_s`` afterwards requests fail at once without touching the network; then the
next request tries again.  Failures read as misses (``False``, ``None``, ``0``): SGLang
recomputes those pages.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch
import zmq
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from lmcache.v1.multiprocess.wire.custom_types import ObjectScope
from lmcache.v1.multiprocess.worker.client import (
    DEFAULT_URL,
    MPClient,
    MPClientError,
    ServerError,
    normalize_url,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_RETRY_AFTER_S = 5.0
# Page bytes per request; a larger batch is split (the server's default request limit,
# --max-message-mb, is 169 MiB).  A single page above it goes alone.
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
# The shortest time between two warnings about failed requests.
WARN_INTERVAL_S = 30.0
# Keys of --hicache-storage-backend-extra-config this backend reads (the factory's own
# keys and SGLang's are ignored).
CONFIG_KEYS = (
    "lmcache_url",
    "mp_host",
    "mp_port",
    "timeout_s",
    "retry_after_s",
    "cache_salt",
    "max_request_bytes",
)


@dataclasses.dataclass(frozen=True)
class HiCacheSettings:
    """What the backend reads from ``--hicache-storage-backend-extra-config``."""

    url: str = DEFAULT_URL
    timeout_s: float = DEFAULT_TIMEOUT_S
    retry_after_s: float = DEFAULT_RETRY_AFTER_S
    cache_salt: str = ""
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> HiCacheSettings:
        """Settings from the extra config; raises ``ValueError`` naming a bad value."""
        extra = extra or {}
        if "lmcache_url" in extra:
            url = normalize_url(str(extra["lmcache_url"]))
        elif "mp_host" in extra or "mp_port" in extra:
            url = f"tcp://{extra.get('mp_host', '127.0.0.1')}:{int(extra.get('mp_port', 5555))}"
        else:
            url = DEFAULT_URL
        settings = cls(
            url=url,
            timeout_s=float(extra.get("timeout_s", DEFAULT_TIMEOUT_S)),
            retry_after_s=float(extra.get("retry_after_s", DEFAULT_RETRY_AFTER_S)),
            cache_salt=str(extra.get("cache_salt", "")),
            max_request_bytes=int(extra.get("max_request_bytes", DEFAULT_MAX_REQUEST_BYTES)),
        )
        if settings.timeout_s <= 0 or settings.retry_after_s < 0:
            raise ValueError(
                f"LMCacheHiCacheStorage: timeout_s must be > 0 and retry_after_s >= 0, got "
                f"{settings.timeout_s} and {settings.retry_after_s}"
            )
        if settings.max_request_bytes <= 0:
            raise ValueError(
                f"LMCacheHiCacheStorage: max_request_bytes must be > 0, got "
                f"{settings.max_request_bytes}"
            )
        return settings


def rank_of(config: HiCacheStorageConfig) -> tuple[int, int]:
    """(world size, worker id) of this rank's pages.  MLA pages are the same on every TP
    rank (one writer stores them, every rank reads them); DCP splits them by DCP rank."""
    if config.is_mla_model:
        return config.dcp_size, config.dcp_rank
    return config.tp_size, config.tp_rank


def shard_of(config: HiCacheStorageConfig) -> str:
    """What else splits this rank's pages: pipeline stage and context-parallel rank."""
    shard = f"pp{config.pp_rank}of{config.pp_size}"
    if config.attn_cp_size > 1:
        shard += f"/cp{config.attn_cp_rank}of{config.attn_cp_size}"
    if config.dcp_size > 1:
        shard += f"/page{config.logical_page_size}"
    return shard


def page_format(host_pool: Any) -> str:
    """The byte format of a host pool's flat pages: a page written in one format is never
    read back into a pool of another (layout, dtype and page geometry all change bytes)."""
    dummy = host_pool.get_dummy_flat_data_page()
    nbytes = dummy.numel() * dummy.element_size()
    dtype = str(getattr(host_pool, "dtype", dummy.dtype)).removeprefix("torch.")
    layout = getattr(host_pool, "layout", "?")
    return f"{layout}/{dtype}/p{getattr(host_pool, 'page_size', 1)}/b{nbytes}"


class _Unavailable(Exception):
    """The server did not answer (or is in its back-off window): the call is a miss."""


@dataclasses.dataclass
class _Pool:
    """One registered host pool: its object scope and the page geometry."""

    host: Any
    scope: ObjectScope
    page_size: int
    page_bytes: int
    dtype: torch.dtype


class LMCacheHiCacheStorage(HiCacheStorage):
    """HiCache L3 pages as named objects of an ``lmcache server``."""

    def __init__(
        self,
        storage_config: HiCacheStorageConfig,
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.storage_config = storage_config
        self.settings = HiCacheSettings.from_extra_config(storage_config.extra_config)
        self.model_name = storage_config.model_name or "default"
        self._world_size, self._worker_id = rank_of(storage_config)
        self._shard = shard_of(storage_config)
        self._pools: dict[str, _Pool] = {}
        # Pages before a pool is registered (the legacy tensor API): raw bytes.
        self._raw_scope = self._scope("raw")
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._local = threading.local()
        self._clients: list[MPClient] = []
        self._clients_lock = threading.Lock()
        self._down_until = 0.0
        self._last_warning = -WARN_INTERVAL_S
        self._closed = False
        logger.info(
            "LMCacheHiCacheStorage: %s, model %r rank %d of %d (%s)",
            self.settings.url,
            self.model_name,
            self._worker_id,
            self._world_size,
            self._shard,
        )

    # -- registration -------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        if not hasattr(mem_pool_host, "get_dummy_flat_data_page"):
            # A hybrid model's HostPoolGroup: its pools (KV included) come one by one
            # through register_mem_host_pool_v2.
            return
        self._pools[PoolName.KV.value] = self._pool(mem_pool_host, PoolName.KV.value)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(host_pool_name)
        self._pools[name] = self._pool(host_pool, name)

    def _scope(self, fmt: str) -> ObjectScope:
        return ObjectScope(
            model_name=self.model_name,
            world_size=self._world_size,
            worker_id=self._worker_id,
            cache_salt=self.settings.cache_salt,
            shard=f"{self._shard}/{fmt}",
        )

    def _pool(self, host: Any, name: str) -> _Pool:
        dummy = host.get_dummy_flat_data_page()
        return _Pool(
            host=host,
            scope=self._scope(f"{name}/{page_format(host)}"),
            page_size=int(getattr(host, "page_size", 1) or 1),
            page_bytes=dummy.numel() * dummy.element_size(),
            dtype=dummy.dtype,
        )

    def _kv_pool(self) -> _Pool | None:
        return self._pools.get(PoolName.KV.value)

    # -- the connection -----------------------------------------------------------------------

    def _client(self) -> MPClient:
        client: MPClient | None = getattr(self._local, "client", None)
        if client is not None:
            return client
        client = MPClient(
            self.settings.url,
            timeout=self.settings.timeout_s,
            connect_timeout=self.settings.timeout_s,
            context=self._ctx,
        )
        with self._clients_lock:
            if self._closed:
                client.close()
                raise _Unavailable("the backend is closed")
            self._clients.append(client)
        self._local.client = client
        return client

    def _call(self, what: str, fn: Callable[[MPClient], _T]) -> _T:
        """``fn(client)``, or :class:`_Unavailable` (logged) if the server does not answer,
        refuses the request, or is still in its back-off window."""
        if self._closed:
            raise _Unavailable("the backend is closed")
        if time.monotonic() < self._down_until:
            raise _Unavailable("the server did not answer recently")
        try:
            return fn(self._client())
        except ServerError as exc:
            # The server answered and refused this request (e.g. a page above its
            # --max-message-mb): a miss, and no reason to stop asking.
            self._warn(f"{what} refused by the server ({exc}); treated as a miss")
            raise _Unavailable(str(exc)) from None
        except (MPClientError, zmq.ZMQError, OSError) as exc:
            # Pages go out zero-copy, viewing the host pool: a request still queued in
            # the socket would reach a server that comes back and store whatever SGLang
            # has since put in that host slot.  Closing the socket drops it.
            self._drop_client()
            # Wedged or gone: stop asking for a while, so each call costs at most one
            # timeout per back-off window instead of one per call.
            self._down_until = time.monotonic() + self.settings.retry_after_s
            self._warn(
                f"{what} failed ({exc}); treated as a miss, next try in "
                f"{self.settings.retry_after_s:.1f}s"
            )
            raise _Unavailable(str(exc)) from None

    def _drop_client(self) -> None:
        """Close this thread's client (unsent requests are discarded); the next call
        connects anew."""
        client: MPClient | None = getattr(self._local, "client", None)
        if client is None:
            return
        self._local.client = None
        with self._clients_lock:
            if client in self._clients:
                self._clients.remove(client)
        client.close()

    def _warn(self, message: str) -> None:
        """A warning at most every :data:`WARN_INTERVAL_S` (the rest at debug level): a
        server away for an hour must not fill the log."""
        now = time.monotonic()
        if now - self._last_warning >= WARN_INTERVAL_S:
            self._last_warning = now
            logger.warning("LMCacheHiCacheStorage: %s", message)
        else:
            logger.debug("LMCacheHiCacheStorage: %s", message)

    def _put(self, scope: ObjectScope, names: list[str], frames: list[Any]) -> list[bool]:
        try:
            return self._call("put_objects", lambda c: c.put_objects(scope, names, frames))
        except _Unavailable:
            return [False] * len(names)

    def _get(self, scope: ObjectScope, names: list[str]) -> list[memoryview | None]:
        try:
            return self._call("get_objects", lambda c: c.get_objects(scope, names))
        except _Unavailable:
            return [None] * len(names)

    # -- batches of pages ---------------------------------------------------------------------

    def _batches(self, count: int, page_bytes: int) -> Iterator[range]:
        step = max(1, self.settings.max_request_bytes // max(1, page_bytes))
        for start in range(0, count, step):
            yield range(start, min(count, start + step))

    def _page_indices(self, pool: _Pool, keys: Sequence[str], host_indices: Any) -> list[int]:
        """The host-pool index of each key's page; raises ``ValueError`` on a bad length."""
        if host_indices is None or int(host_indices.numel()) != len(keys) * pool.page_size:
            got = 0 if host_indices is None else int(host_indices.numel())
            raise ValueError(
                f"{len(keys)} pages of {pool.page_size} tokens need "
                f"{len(keys) * pool.page_size} host indices, got {got}"
            )
        flat = host_indices.tolist()
        return [int(flat[i * pool.page_size]) for i in range(len(keys))]

    def _read_pages(self, pool: _Pool, keys: Sequence[str], indices: Sequence[int]) -> list[bool]:
        """Store the pages of the host pool at ``indices`` under ``keys``."""
        results: list[bool] = []
        for batch in self._batches(len(keys), pool.page_bytes):
            names = [keys[i] for i in batch]
            # A flat page view is contiguous in page-first layouts (sent zero-copy);
            # layer-first layouts gather the page's layers into one buffer.
            frames = [
                pool.host.get_data_page(indices[i], flat=True)
                .contiguous()
                .view(torch.uint8)
                .numpy()
                for i in batch
            ]
            stored = self._put(pool.scope, names, frames)
            results.extend(stored)
            if not all(stored):
                results.extend([False] * (len(keys) - len(results)))
                break
        return results

    def _write_pages(self, pool: _Pool, keys: Sequence[str], indices: Sequence[int]) -> list[bool]:
        """Load ``keys`` into the host pool at ``indices``; a page whose size is not the
        pool's is refused (never written into the pool)."""
        results: list[bool] = []
        for batch in self._batches(len(keys), pool.page_bytes):
            found = self._get(pool.scope, [keys[i] for i in batch])
            for i, data in zip(batch, found):
                results.append(self._fill(pool, keys[i], indices[i], data))
        return results

    def _fill(self, pool: _Pool, key: str, index: int, data: memoryview | None) -> bool:
        if data is None:
            return False
        if data.nbytes != pool.page_bytes:
            logger.warning(
                "LMCacheHiCacheStorage: page %s has %d bytes, the pool's pages %d: not loaded",
                key,
                data.nbytes,
                pool.page_bytes,
            )
            return False
        page = torch.frombuffer(data, dtype=torch.uint8).view(pool.dtype)
        pool.host.set_from_flat_data_page(index, page)
        return True

    def _count_prefix(self, scope: ObjectScope, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        try:
            return self._call(
                "count_object_prefix", lambda c: c.count_object_prefix(scope, list(keys))
            )
        except _Unavailable:
            return 0

    # -- v1: zero-copy through the registered host pool ---------------------------------------

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._zero_copy("batch_get_v1", keys, host_indices, self._write_pages)

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._zero_copy("batch_set_v1", keys, host_indices, self._read_pages)

    def _zero_copy(
        self,
        method: str,
        keys: list[str],
        host_indices: torch.Tensor,
        move: Callable[[_Pool, Sequence[str], Sequence[int]], list[bool]],
    ) -> list[bool]:
        """A v1 call: ``move`` the pages of ``keys`` between the registered host pool
        (at ``host_indices``) and the server; every failure is a per-page False."""
        pool = self._kv_pool()
        if pool is None:
            logger.error("LMCacheHiCacheStorage: %s before register_mem_pool_host", method)
            return [False] * len(keys)
        try:
            indices = self._page_indices(pool, keys, host_indices)
        except ValueError as exc:
            logger.error("LMCacheHiCacheStorage: %s: %s", method, exc)
            return [False] * len(keys)
        return move(pool, keys, indices)

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """How many leading ``keys`` are stored (SGLang loads only a prefix)."""
        return self._count_prefix(self._kv_scope(), keys)

    def _kv_scope(self) -> ObjectScope:
        pool = self._kv_pool()
        return self._raw_scope if pool is None else pool.scope

    # -- v2: several host pools (PoolTransfer) ------------------------------------------------

    def batch_exists_v2(
        self,
        keys: list[str],
        pool_transfers: list[PoolTransfer] | None = None,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> PoolTransferResult:
        """The longest KV prefix whose pages every extra pool can restore, by its policy:
        ``all_pages`` needs each page of the prefix, ``trailing_pages`` only the last
        ``len(transfer.keys)`` (e.g. Mamba/SWA state); ``block_groups`` is not supported
        (such a pool restores nothing, so nothing is loaded)."""
        kv_pages = self._count_prefix(self._kv_scope(), keys)
        hits: dict[str, int] = {PoolName.KV.value: kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            if not restorable:
                break
            name = str(transfer.name)
            pool = self._pools.get(name)
            if pool is None:
                logger.error("LMCacheHiCacheStorage: pool %s was never registered", name)
                restorable = set()
                break
            allowed = self._restorable(pool, transfer, keys, kv_pages)
            if allowed:
                hits[name] = max(allowed)
            restorable &= allowed
        ordered = sorted(restorable)
        return PoolTransferResult(ordered[-1] if ordered else 0, hits, ordered)

    def _restorable(
        self, pool: _Pool, transfer: PoolTransfer, keys: Sequence[str], kv_pages: int
    ) -> set[int]:
        """The prefix lengths (in pages, 1..kv_pages) this pool can restore."""
        if transfer.hit_policy == PoolHitPolicy.ALL_PAGES:
            return set(range(1, self._count_prefix(pool.scope, keys[:kv_pages]) + 1))
        if transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
            window = max(1, len(transfer.keys or ()))
            return {
                length
                for length in range(1, kv_pages + 1)
                if self._count_prefix(pool.scope, keys[max(0, length - window) : length])
                == min(window, length)
            }
        logger.warning(
            "LMCacheHiCacheStorage: hit policy %s of pool %s is not supported",
            transfer.hit_policy,
            transfer.name,
        )
        return set()

    def batch_get_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[str, list[bool]]:
        return self._batch_v2(transfers, self._write_pages, "batch_get_v2")

    def batch_set_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[str, list[bool]]:
        return self._batch_v2(transfers, self._read_pages, "batch_set_v2")

    def _batch_v2(
        self,
        transfers: list[PoolTransfer],
        io: Callable[[_Pool, Sequence[str], Sequence[int]], list[bool]],
        what: str,
    ) -> dict[str, list[bool]]:
        results: dict[str, list[bool]] = {}
        for transfer in transfers:
            keys = list(transfer.keys or [])
            pool = self._pools.get(str(transfer.name))
            if pool is None:
                logger.error("LMCacheHiCacheStorage: %s: pool %s unknown", what, transfer.name)
                results[transfer.name] = [False] * len(keys)
                continue
            try:
                indices = self._page_indices(pool, keys, transfer.host_indices)
            except ValueError as exc:
                logger.error("LMCacheHiCacheStorage: %s: %s: %s", what, transfer.name, exc)
                results[transfer.name] = [False] * len(keys)
                continue
            results[transfer.name] = io(pool, keys, indices)
        return results

    # -- the legacy tensor API ----------------------------------------------------------------

    def get(
        self,
        key: str,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> torch.Tensor | None:
        """The page stored under ``key``: copied into ``target_location`` when given (its
        size must match), else a new tensor of the KV pool's dtype (bytes before a pool
        is registered)."""
        return self.batch_get([key], [target_location])[0]

    def batch_get(
        self,
        keys: list[str],
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> list[torch.Tensor | None]:
        targets = list(target_locations) if target_locations is not None else []
        targets += [None] * (len(keys) - len(targets))
        scope = self._kv_scope()
        pool = self._kv_pool()
        results: list[torch.Tensor | None] = []
        for batch in self._batches(len(keys), pool.page_bytes if pool else 1):
            found = self._get(scope, [keys[i] for i in batch])
            for i, data in zip(batch, found):
                results.append(self._tensor(keys[i], data, targets[i], pool))
        return results

    def _tensor(
        self, key: str, data: memoryview | None, target: Any, pool: _Pool | None
    ) -> torch.Tensor | None:
        if data is None:
            return None
        raw = torch.frombuffer(data, dtype=torch.uint8)
        if target is None:
            return raw.view(pool.dtype).clone() if pool is not None else raw.clone()
        if target.numel() * target.element_size() != data.nbytes:
            logger.warning(
                "LMCacheHiCacheStorage: page %s has %d bytes, its target %d: not loaded",
                key,
                data.nbytes,
                target.numel() * target.element_size(),
            )
            return None
        target.view(-1).view(torch.uint8).copy_(raw)
        return target  # type: ignore[no-any-return]

    def set(
        self,
        key: str,
        value: Any | None = None,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        """Store ``values[i]`` (tensors) under ``keys[i]``; True when all are stored."""
        if values is None or len(values) != len(keys):
            logger.error("LMCacheHiCacheStorage: batch_set needs one tensor per key")
            return False
        data = [v.contiguous().view(-1).view(torch.uint8) for v in values]
        scope = self._kv_scope()
        biggest = max((t.numel() for t in data), default=1)
        for batch in self._batches(len(keys), biggest):
            stored = self._put(scope, [keys[i] for i in batch], [data[i].numpy() for i in batch])
            if not all(stored):
                return False
        return True

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def clear(self) -> None:
        """Nothing to do: the server's eviction frees its space, and dropping every object
        is an admin operation of the server (``lmcache`` clear with --enable-admin-ops)."""
        logger.info("LMCacheHiCacheStorage: clear() leaves the server's objects in place")

    def get_stats(self) -> None:
        return None

    def close(self) -> None:
        with self._clients_lock:
            self._closed = True
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        # destroy, not term: a client still being made in another thread must not make
        # shutdown wait forever.
        self._ctx.destroy(linger=0)
