"""Keys per tenant: each ``cache_salt`` gets its own AES key, derived from one master key.

The master key comes from a file (``master_key_path``, upstream's field) or an environment
variable (``master_key_env``); it never appears in the configuration itself.  Derivation is
HKDF-SHA256 with the salt in the ``info`` input, so a tenant's key reveals nothing about
another's or about the master key, and no per-tenant key has to be stored anywhere.
"""

from __future__ import annotations

import abc
import os
import threading

from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MIN_MASTER_KEY_BYTES = 16
"""A master key shorter than this is refused: it is a typo or a placeholder, not a key."""


class KeyProvider(abc.ABC):
    """The AES key of a ``cache_salt``.  Thread-safe: serde threads call it concurrently."""

    @abc.abstractmethod
    def get_key(self, cache_salt: str) -> bytes:
        """The key bytes (16 or 32) for ``cache_salt`` ("" is the unsalted tenant)."""


class HkdfKeyProvider(KeyProvider):
    """HKDF-SHA256 of ``master_key`` with ``info = info_prefix + cache_salt``, ``key_len``
    bytes, computed once per salt.

    ``info_prefix`` separates the keys of different uses of one master key: two prefixes
    never derive the same key for a salt.
    """

    def __init__(self, master_key: bytes, key_len: int, info_prefix: bytes) -> None:
        if not master_key:
            raise ValueError("master_key must be non-empty")
        if key_len not in (16, 24, 32):
            raise ValueError(f"key_len must be 16, 24 or 32 bytes, got {key_len}")
        self._master_key = bytes(master_key)
        self._key_len = key_len
        self._info_prefix = bytes(info_prefix)
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def get_key(self, cache_salt: str) -> bytes:
        with self._lock:
            key = self._keys.get(cache_salt)
            if key is None:
                hkdf = HKDF(
                    algorithm=SHA256(),
                    length=self._key_len,
                    salt=None,
                    info=self._info_prefix + cache_salt.encode("utf-8"),
                )
                key = hkdf.derive(self._master_key)
                self._keys[cache_salt] = key
            return key


def load_master_key(path: str | None = None, env: str | None = None) -> bytes:
    """The master key from the file ``path`` (its bytes) or the environment variable ``env``
    (its UTF-8 bytes): exactly one of them.  Clear errors for a missing file or variable
    and for a key shorter than :data:`MIN_MASTER_KEY_BYTES`."""
    if bool(path) == bool(env):
        raise ValueError("aesgcm serde needs exactly one of 'master_key_path' or 'master_key_env'")
    if path:
        try:
            with open(path, "rb") as f:
                key = f.read()
        except OSError as exc:
            raise ValueError(f"aesgcm serde: cannot read master_key_path {path!r}: {exc}") from exc
        source = f"master_key_path {path!r}"
    else:
        assert env is not None
        value = os.environ.get(env)
        if value is None:
            raise ValueError(f"aesgcm serde: environment variable {env!r} (master_key_env) unset")
        key = value.encode("utf-8")
        source = f"environment variable {env!r}"
    if len(key) < MIN_MASTER_KEY_BYTES:
        raise ValueError(
            f"aesgcm serde: the master key in {source} has {len(key)} bytes; "
            f"at least {MIN_MASTER_KEY_BYTES} are needed"
        )
    return key
