"""Named objects: opaque byte strings an engine stores under its own names.

SGLang's HiCache keys each KV page by a hash of its tokens, and its page size is not the
server's chunk size, so its pages cannot be token chunks.  They are stored here as they
come: one L1 object per name, in the same tiers, under the same eviction and
write-through as chunks.

A name lives in an :class:`~lmcache.v1.multiprocess.wire.custom_types.ObjectScope`
(model, rank, tenant, shard).  Its storage key is a ``CacheEngineKey`` whose model name
carries :data:`OBJECT_MODEL_SUFFIX` (so object keys never meet token-chunk keys, nor a
model's KV events) and whose chunk hash is a 64-bit hash of tenant, shard and name, salted
as chunk hashes are.  The tenant also rides on the key for the tiers
(:func:`~lmcache.v1.storage_backend.cache_salt.salt_of`).

Nothing here waits for memory: a put that finds no evictable room in L1 reports that
name as not stored at once (the engine keeps its page and may try again).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.multiprocess.server.inline_codec import pinned_sized_frames
from lmcache.v1.multiprocess.server.pending import Pending
from lmcache.v1.multiprocess.server.state import ServerCore
from lmcache.v1.multiprocess.wire.custom_types import ObjectScope
from lmcache.v1.multiprocess.wire.protocol import BulkReply, ErrorCode, ProtocolError
from lmcache.v1.storage_backend.cache_salt import configs_with_salt

logger = logging.getLogger(__name__)

OBJECT_MODEL_SUFFIX = "#objects"
"""Appended to the scope's model name in storage keys: the object namespace of a model."""
OBJECT_FORMAT = MemoryFormat.BINARY_BUFFER
# The metrics' transfer_mode and sub_path labels of object bytes (lmcache_mp_*_bytes_total).
METRIC_MODE = "objects"
METRIC_SUB_PATH = "framed"
_OBJECT_DTYPE = torch.uint8


def object_hash(scope: ObjectScope, name: str) -> int:
    """The 64-bit chunk hash of ``name`` in ``scope``: tenant, shard and name, each
    length-prefixed (no two different triples hash the same bytes)."""
    h = hashlib.blake2b(digest_size=8, person=b"lmc-objects")
    for part in (scope.cache_salt, scope.shard, name):
        raw = part.encode()
        h.update(len(raw).to_bytes(4, "little"))
        h.update(raw)
    return int.from_bytes(h.digest(), "little")


def object_key(scope: ObjectScope, name: str) -> CacheEngineKey:
    """The storage key of ``name`` in ``scope``."""
    return CacheEngineKey(
        scope.model_name + OBJECT_MODEL_SUFFIX,
        scope.world_size,
        scope.worker_id,
        object_hash(scope, name),
        _OBJECT_DTYPE,
        configs_with_salt(None, scope.cache_salt),
    )


def _is_object(obj: MemoryObj) -> bool:
    return obj.get_memory_format() is OBJECT_FORMAT and obj.get_dtype() == _OBJECT_DTYPE


class ObjectOps(ServerCore):
    """``put_objects``, ``get_objects`` and ``count_object_prefix``."""

    def count_object_prefix(self, scope: ObjectScope, names: list[str]) -> int:
        """How many leading ``names`` are stored (in any tier)."""
        scope = self._admit_scope(scope, False, "count_object_prefix")
        return self.storage.batched_contains([object_key(scope, n) for n in names])

    def get_objects(self, scope: ObjectScope, names: list[str]) -> BulkReply:
        """Per name, whether it was found; then one frame per found object (zero-copy
        views of the stored objects, pinned until sent)."""
        scope = self._admit_scope(scope, False, "get_objects")
        keys = [object_key(scope, n) for n in names]
        found = self.storage.batched_get_blocking(keys)
        hits: list[MemoryObj] = []
        flags: list[bool] = []
        for name, obj in zip(names, found):
            if obj is not None and not _is_object(obj):
                logger.warning("stored object %r is not a byte object: treated as a miss", name)
                obj.ref_count_down()
                obj = None
            flags.append(obj is not None)
            if obj is not None:
                hits.append(obj)
        pending = Pending([], hits, [])
        try:
            frames = pinned_sized_frames(hits, [o.get_size() for o in hits], pending.release)
        except BaseException:
            pending.release()
            raise
        self._count(retrieved_objects=len(hits))
        if self.metrics is not None:
            self.metrics.add_retrieved(
                METRIC_MODE, METRIC_SUB_PATH, sum(o.get_size() for o in hits)
            )
        return BulkReply(flags, frames)

    def put_objects(
        self, scope: ObjectScope, names: Sequence[str], frames: Sequence[memoryview]
    ) -> list[bool]:
        """Store one data frame per name; per name, whether it is stored now (False: no
        evictable room in L1 for it)."""
        scope = self._admit_scope(scope, True, "put_objects")
        if len(frames) != len(names):
            raise ProtocolError(
                ErrorCode.BAD_PAYLOAD,
                f"put_objects names {len(names)} objects but sent {len(frames)} data frames",
            )
        empty = [n for n, f in zip(names, frames) if f.nbytes == 0]
        if empty:
            raise ProtocolError(ErrorCode.BAD_PAYLOAD, f"put_objects: empty object {empty[0]!r}")
        stored: list[bool] = []
        keys: list[Any] = []
        objs: list[MemoryObj] = []
        seen: set[Any] = set()
        try:
            for name, frame in zip(names, frames):
                key = object_key(scope, name)
                # Names are content hashes: a stored name already holds these bytes.
                if key in seen or self.storage.contains(key):
                    stored.append(True)
                    continue
                obj = self.storage.allocate(
                    torch.Size([frame.nbytes]), _OBJECT_DTYPE, OBJECT_FORMAT, busy_loop=False
                )
                if obj is None:
                    stored.append(False)
                    continue
                raw = obj.raw_tensor
                assert raw is not None
                raw[: frame.nbytes].copy_(torch.frombuffer(frame, dtype=torch.uint8))
                keys.append(key)
                objs.append(obj)
                seen.add(key)
                stored.append(True)
            if keys:
                self.storage.batched_submit_put_task(keys, objs)
        finally:
            for obj in objs:
                obj.ref_count_down()
        self._count(stored_objects=len(keys))
        if self.metrics is not None:
            nbytes = sum(o.get_size() for o in objs)
            self.metrics.add_stored(METRIC_MODE, METRIC_SUB_PATH, nbytes)
        return stored
