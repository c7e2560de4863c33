"""Storage keys as an L2 adapter sees them: :class:`CacheEngineKey` -> :class:`ObjectKey`.

The mapping is one-way (the bridge keeps its own index) and injective in practice:

* ``chunk_hash``: the chunk hash (two's complement, big-endian, at least 8 bytes) followed
  by 8 bytes of a digest of the dtype, the layer of a layer key and the ``lmcache.tag.*``
  tags -- the parts of a key's identity an ``ObjectKey`` has no field for;
* ``model_name``: the model name, ``@`` escaped (adapters split key strings on it);
* ``kv_rank``: upstream's packing of world size and worker (:meth:`ObjectKey.ComputeKVRank`);
* ``cache_salt``: the key's tenant (:func:`~lmcache.v1.storage_backend.cache_salt.salt_of`),
  or a digest of it when it holds a character or length ``ObjectKey`` refuses.
"""

from __future__ import annotations

import hashlib

from lmcache.utils import CacheEngineKey, dtype_to_str
from lmcache.v1.storage_backend.cache_salt import salt_of
from lmcache.v1.storage_backend.l2_adapters.types import ObjectKey

_MIN_HASH_BYTES = 8
_DIGEST_BYTES = 8
_SALT_REFUSED = frozenset("@/\\\x00")
_SALT_MAX_LEN = 128


def _hash_bytes(chunk_hash: int) -> bytes:
    length = max(_MIN_HASH_BYTES, (chunk_hash.bit_length() + 8) // 8)
    return chunk_hash.to_bytes(length, "big", signed=True)


def _identity_digest(key: CacheEngineKey) -> bytes:
    # A layer key (LayerCacheEngineKey) is one layer of a chunk: its layer is identity too.
    layer = getattr(key, "layer_id", None)
    fields = [dtype_to_str(key.dtype), "" if layer is None else str(layer)]
    text = "|".join([*fields, *(f"{name}%{value}" for name, value in key.tags)])
    return hashlib.blake2b(text.encode(), digest_size=_DIGEST_BYTES).digest()


def adapter_salt(salt: str) -> str:
    """``salt`` itself, or ``h-<digest>`` when ``ObjectKey`` would refuse it."""
    if len(salt) <= _SALT_MAX_LEN and not (_SALT_REFUSED & set(salt)):
        return salt
    return "h-" + hashlib.blake2b(salt.encode(), digest_size=16).hexdigest()


def object_key_of(key: CacheEngineKey) -> ObjectKey:
    """The adapter key of ``key`` (see the module doc)."""
    return ObjectKey(
        chunk_hash=_hash_bytes(key.chunk_hash) + _identity_digest(key),
        model_name=key.model_name.replace("@", "%40"),
        kv_rank=ObjectKey.ComputeKVRank(
            key.world_size, key.worker_id, key.world_size, key.worker_id
        ),
        cache_salt=adapter_salt(salt_of(key)),
    )
