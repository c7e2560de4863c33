"""``KVCacheWorker``: store, look up and retrieve KV cache through an MP server, no engine needed.

A worker owns per-layer paged KV tensors (``[2, NB, BS, NH, HS]`` or MLA ``[NB, BS, HS]``)
and addresses them by block ids, exactly as an inference engine would::

    worker = KVCacheWorker(kv_caches, model_name="demo", server_url="tcp://127.0.0.1:5555")
    worker.store(token_ids, block_ids)          # blocks -> server
    hit = worker.lookup(token_ids)              # tokens the server holds (prefix)
    worker.retrieve(token_ids, other_block_ids) # server -> blocks
    worker.close()

``block_ids`` is the request's block table from token 0 (or exactly the blocks of
``[start, end)``).  For tensor parallelism run one worker per rank with the same
``world_size``; :meth:`lookup` with ``tp_size`` hits only where every rank stored.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lmcache.v1.multiprocess.transfer_context.worker_transfer import (
    TransferContext,
    create_transfer_context,
)
from lmcache.v1.multiprocess.wire.chunking import hit_chunks_to_tokens
from lmcache.v1.multiprocess.wire.curve import CurveClientKeys, client_keys_from_files
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey, ServerStats
from lmcache.v1.multiprocess.worker.client import DEFAULT_URL, MPClient
from lmcache.v1.platform.transfer_mode import MPTransferMode

logger = logging.getLogger(__name__)
# How long lookup() waits for the server's background promotion of its hits into L1.
LOOKUP_PREFETCH_WAIT_S = 60.0


def new_instance_id() -> int:
    return uuid.uuid4().int & ((1 << 62) - 1)


def _normalize_block_ids(block_ids: Sequence[Any]) -> list[list[int]]:
    items: list[Any] = list(block_ids)
    if items and isinstance(items[0], Sequence | torch.Tensor):
        return [[int(b) for b in group] for group in items]
    return [[int(b) for b in items]]


class KVCacheWorker:
    """One worker (one TP rank) connected to an MP cache server."""

    def __init__(
        self,
        kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
        *,
        model_name: str,
        server_url: str = DEFAULT_URL,
        world_size: int = 1,
        rank: int = 0,
        mode: str | MPTransferMode | None = None,
        sub_path: str | None = None,
        instance_id: int | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        heartbeat_interval: float = 10.0,
        curve_secret_key_file: str | None = None,
        curve_server_key_file: str | None = None,
        curve: CurveClientKeys | None = None,
    ) -> None:
        """``curve_secret_key_file`` (this client's ``NAME.key_secret``) and
        ``curve_server_key_file`` (the server's public ``.key``), or ``curve`` (the keys
        already loaded): for a server with ``--curve-secret-key-file``."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in world size {world_size}")
        self.model_name = model_name
        self.world_size = world_size
        self.rank = rank
        self.instance_id = new_instance_id() if instance_id is None else instance_id
        if curve is None:
            curve = client_keys_from_files(
                curve_secret_key_file, curve_server_key_file, "KVCacheWorker"
            )
        self.client = MPClient(server_url, timeout, connect_timeout=connect_timeout, curve=curve)
        self.context: TransferContext | None = None
        self._stop = threading.Event()
        # Held by transfers and by a re-registration, which swaps the server's pool mapping.
        self._transfer_lock = threading.Lock()
        try:
            self.chunk_size = self.client.get_chunk_size()
            tensors = (
                list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)
            )
            self.context = create_transfer_context(
                tensors,
                instance_id=self.instance_id,
                req_client=self.client,
                mode=mode,
                sub_path=sub_path,
            )
            block_size = _block_size(tensors)
            if self.chunk_size % block_size:
                raise ValueError(
                    f"server chunk size {self.chunk_size} is not a multiple of the block size "
                    f"{block_size}"
                )
            self.context.register(
                tensors, model_name, world_size, self.chunk_size // block_size, timeout
            )
        except BaseException:
            self._close_quietly()
            raise
        self.mode = self.context.mode
        self.sub_path = getattr(self.context, "sub_path", "")
        self._heartbeat = threading.Thread(
            target=self._beat, args=(heartbeat_interval,), name="lmc-heartbeat", daemon=True
        )
        if heartbeat_interval > 0:
            self._heartbeat.start()

    def _beat(self, interval: float) -> None:
        """Ping; a server that answers but no longer knows this worker restarted (or reaped
        it): register again, so the worker survives server restarts on its own."""
        outage = False
        while not self._stop.wait(interval):
            try:
                if not self.client.ping(self.instance_id):
                    self.register_again()
                    logger.info("worker %d registered again with the server", self.instance_id)
                if outage:
                    logger.info("cache server at %s reachable again", self.client.url)
                outage = False
            except Exception as exc:
                # One warning per outage; the heartbeat keeps trying quietly.
                log = logger.debug if outage else logger.warning
                log("heartbeat to the cache server failed: %s", exc)
                outage = True

    def register_again(self) -> None:
        """Register this worker's KV cache with a server that forgot it (a restart)."""
        assert self.context is not None
        with self._transfer_lock:
            self.context.register_again()

    def key(
        self,
        token_ids: Sequence[int] | torch.Tensor,
        start: int = 0,
        end: int | None = None,
        *,
        request_id: str = "",
        cache_salt: str = "",
        worker_id: int | str | None = "rank",
    ) -> IPCCacheServerKey:
        tokens = tuple(int(t) for t in token_ids)
        return IPCCacheServerKey(
            model_name=self.model_name,
            world_size=self.world_size,
            worker_id=self.rank if worker_id == "rank" else worker_id,  # type: ignore[arg-type]
            token_ids=tokens,
            start=start,
            end=len(tokens) if end is None else end,
            request_id=request_id,
            cache_salt=cache_salt,
            num_kv_readers=1,
        )

    def store(
        self,
        token_ids: Sequence[int] | torch.Tensor,
        block_ids: Sequence[Any],
        start: int = 0,
        end: int | None = None,
        *,
        cache_salt: str = "",
    ) -> bool:
        """Copy the blocks of tokens ``[start, end)`` to the server; True once visible."""
        assert self.context is not None
        key = self.key(token_ids, start, end, cache_salt=cache_salt)
        with self._transfer_lock:
            future = self.context.submit_store(
                "", key, None, _normalize_block_ids(block_ids), None, 0
            )
            return bool(future.result())

    def retrieve(
        self,
        token_ids: Sequence[int] | torch.Tensor,
        block_ids: Sequence[Any],
        start: int = 0,
        end: int | None = None,
        *,
        skip_first_n_tokens: int = 0,
        cache_salt: str = "",
    ) -> bool:
        """Copy tokens ``[start, end)`` from the server into the blocks; False on a miss."""
        assert self.context is not None
        key = self.key(token_ids, start, end, cache_salt=cache_salt)
        with self._transfer_lock:
            future = self.context.submit_retrieve(
                "", key, None, _normalize_block_ids(block_ids), None, 0, skip_first_n_tokens
            )
            return bool(future.result())

    def lookup(
        self,
        token_ids: Sequence[int] | torch.Tensor,
        *,
        tp_size: int | None = None,
        cache_salt: str = "",
        keep_locks: bool = False,
        request_id: str | None = None,
    ) -> int:
        """Tokens of the longest stored prefix (every rank of ``tp_size`` must hold it).

        With ``keep_locks`` the hit chunks stay pinned until :meth:`end_session`.  Waits
        (up to ``LOOKUP_PREFETCH_WAIT_S``) while the server promotes hits from its lower
        tiers into L1; a prefetch still running then counts as a miss.
        """
        rid = request_id or uuid.uuid4().hex
        key = self.key(token_ids, request_id=rid, cache_salt=cache_salt, worker_id=None)
        self.client.lookup(key, tp_size or self.world_size)
        hit_chunks = self.client.wait_prefetch_status(rid, LOOKUP_PREFETCH_WAIT_S)
        if not keep_locks:
            self.client.end_session(rid)
        return hit_chunks_to_tokens(hit_chunks, self.chunk_size, len(key.token_ids))

    def end_session(self, request_id: str) -> None:
        self.client.end_session(request_id)

    def stats(self) -> ServerStats:
        return self.client.get_stats()

    def _close_quietly(self) -> None:
        self._stop.set()
        if self.context is not None:
            self.context.close()
        self.client.close()

    def close(self) -> None:
        self._close_quietly()

    def __enter__(self) -> KVCacheWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _block_size(tensors: Sequence[torch.Tensor]) -> int:
    shape = tuple(tensors[0].shape)
    return int(shape[2] if len(shape) == 5 else shape[1])
