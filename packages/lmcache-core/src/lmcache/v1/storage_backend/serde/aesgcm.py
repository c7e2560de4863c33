"""``aesgcm``: chunks encrypted and authenticated at rest with AES-GCM, a key per tenant.

Each chunk is one frame ``version u8 (=1) | IV (12 bytes) | ciphertext | tag (16 bytes)``
(upstream's frame).  The IV is random per chunk (``os.urandom``): a key never sees the same
IV twice in practice (96 random bits; NIST's bound of 2**32 frames per key is per tenant
here, since every ``cache_salt`` has its own key).  The key of a chunk is derived from the
master key and the chunk's ``cache_salt`` (:mod:`.key_provider`).

The tier also binds each frame to the chunk's key string and the serde header as
associated data, so a frame moved to another key, or a header edited, fails the tag like
an altered ciphertext or a wrong master key: the read is a miss, never other KV.

Lossless: the round trip is bit-exact.  L1 holds plaintext; only the L2 copy is encrypted.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from lmcache.v1.storage_backend.serde.base import (
    ByteStage,
    Deserializer,
    SerdeError,
    Serializer,
    key_salt,
)
from lmcache.v1.storage_backend.serde.key_provider import KeyProvider

FRAME_VERSION = 1
IV_LEN = 12
TAG_LEN = 16
HEADER_LEN = 1 + IV_LEN
FRAME_OVERHEAD = HEADER_LEN + TAG_LEN
SUPPORTED_AES_BITS = (128, 256)
HKDF_INFO_PREFIX = b"lmcache-l2-aesgcm-v1"
"""HKDF ``info`` prefix of the keys this serde derives (domain separation)."""


class _Ciphers:
    """One ``AESGCM`` per salt (building it expands the key schedule every time)."""

    def __init__(self, keys: KeyProvider) -> None:
        self._keys = keys
        self._ciphers: dict[str, AESGCM] = {}
        self._lock = threading.Lock()

    def get(self, salt: str) -> AESGCM:
        with self._lock:
            cipher = self._ciphers.get(salt)
        if cipher is None:
            cipher = AESGCM(self._keys.get_key(salt))
            with self._lock:
                self._ciphers.setdefault(salt, cipher)
        return cipher


def seal(cipher: AESGCM, plaintext: bytes | memoryview, aad: bytes | None) -> bytes:
    """One frame holding ``plaintext``."""
    iv = os.urandom(IV_LEN)
    return bytes((FRAME_VERSION,)) + iv + cipher.encrypt(iv, plaintext, aad)


def open_frame(cipher: AESGCM, frame: bytes | memoryview, aad: bytes | None) -> bytes:
    """The plaintext of ``frame``: ``ValueError`` for a malformed frame, ``InvalidTag`` for
    an altered one or another key."""
    view = memoryview(frame).cast("B")
    if len(view) < FRAME_OVERHEAD or view[0] != FRAME_VERSION:
        raise ValueError("aesgcm serde: malformed frame or unknown version")
    return cipher.decrypt(bytes(view[1:HEADER_LEN]), view[HEADER_LEN:], aad)


class AesGcmStage(ByteStage):
    """The ``aesgcm`` stage."""

    def __init__(self, keys: KeyProvider, aes_bits: int) -> None:
        if aes_bits not in SUPPORTED_AES_BITS:
            raise ValueError(f"aes_bits must be one of {SUPPORTED_AES_BITS}, got {aes_bits}")
        self.aes_bits = aes_bits
        self._ciphers = _Ciphers(keys)

    @property
    def spec(self) -> str:
        return f"aesgcm:{self.aes_bits}"

    @property
    def overhead(self) -> int:
        return FRAME_OVERHEAD

    def encode(self, data: bytes | memoryview, salt: str, aad: bytes) -> bytes:
        return seal(self._ciphers.get(salt), data, aad)

    def decode(self, data: bytes | memoryview, salt: str, aad: bytes) -> bytes:
        try:
            return open_frame(self._ciphers.get(salt), data, aad)
        except InvalidTag:
            raise SerdeError(
                "aesgcm serde: authentication failed (data altered, or another master key "
                "or tenant)"
            ) from None
        except ValueError as exc:
            raise SerdeError(str(exc)) from None


# -- upstream's per-object interfaces ----------------------------------------------------------


class AesGcmSerializer(Serializer):
    """Upstream's ``aesgcm`` serializer: ``src``'s bytes into one frame in ``dst``, keyed
    by ``key``'s ``cache_salt``."""

    def __init__(self, key_provider: KeyProvider) -> None:
        self._ciphers = _Ciphers(key_provider)

    def serialize(self, src: Any, dst: Any, key: Any) -> int:
        frame = seal(self._ciphers.get(key_salt(key)), bytes(src.byte_array), None)
        # The object's byte_array may have format "<B", which refuses slice assignment.
        out = memoryview(dst.byte_array).cast("B")
        if len(out) < len(frame):
            raise ValueError(f"aesgcm serde: dst holds {len(out)} bytes, {len(frame)} needed")
        out[: len(frame)] = frame
        return len(frame)

    def estimate_serialized_size(self, layout_desc: Any) -> int:
        # Exact: GCM adds no padding, only the frame's header and tag.
        total = 0
        for shape, dtype in zip(layout_desc.shapes, layout_desc.dtypes):
            n = 1
            for dim in shape:
                n *= int(dim)
            total += n * dtype.itemsize
        return total + FRAME_OVERHEAD


class AesGcmDeserializer(Deserializer):
    """Upstream's ``aesgcm`` deserializer.  The plaintext length is ``dst``'s size (``src``
    may be a larger buffer); an altered frame or another key raises ``InvalidTag``."""

    def __init__(self, key_provider: KeyProvider) -> None:
        self._ciphers = _Ciphers(key_provider)

    def deserialize(self, src: Any, dst: Any, key: Any) -> None:
        out = memoryview(dst.byte_array).cast("B")
        blob = memoryview(src.byte_array).cast("B")
        frame_len = FRAME_OVERHEAD + len(out)
        if len(blob) < frame_len:
            raise ValueError("aesgcm serde: malformed frame (shorter than the object)")
        out[:] = open_frame(self._ciphers.get(key_salt(key)), blob[:frame_len], None)
