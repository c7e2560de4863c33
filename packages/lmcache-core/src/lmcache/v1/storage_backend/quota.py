"""Byte quotas per tenant (``cache_salt``) and the per-salt usage the tiers keep.

:class:`QuotaManager` is the registry operators edit (``/quota`` routes, tenant set-up);
its method names and semantics are upstream LMCache 0.5.6's.  A salt without an entry
resolves through one of two lenses:

* :meth:`QuotaManager.get_limit_bytes`, the *allowlist* lens: an unregistered salt's limit
  is ``0``, so all its bytes are over quota.  The tiers' ``IsolatedLRU`` policy reads this
  lens (as upstream's MP server does): when a tier needs room, unregistered tenants and
  tenants over their limit give up space first, and only their own keys.
* :meth:`QuotaManager.effective_limit_bytes`, the *default-quota* lens: an unregistered
  salt gets the registry's default limit, ``None`` (exempt) until
  :meth:`QuotaManager.set_default_limit_bytes` sets one.  Upstream's coordinator uses it;
  here it is offered for callers that must not treat unknown tenants as over quota.

Quotas are soft, as upstream's: a put is never refused for its tenant's quota; the quota
decides who is evicted when a tier is full.

:class:`SaltUsage` is one tier's bytes per salt, kept by the tier as keys enter and leave
(under the tier's lock).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import cast

from lmcache.v1.storage_backend.cache_salt import salt_of


@dataclass(frozen=True)
class QuotaEntry:
    """One registered quota: a salt and its byte limit (upstream's name and fields)."""

    cache_salt: str
    limit_bytes: int


def _check_limit(limit_bytes: int) -> None:
    # bool is an int subclass; True as "1 byte" would be a caller's mistake, not a limit.
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int):
        raise TypeError(f"limit_bytes must be an int (got {limit_bytes!r})")
    if limit_bytes < 0:
        raise ValueError(f"limit_bytes must be non-negative (got {limit_bytes})")


class QuotaManager:
    """Thread-safe registry of byte limits keyed by ``cache_salt``.

    Changes take effect at the next eviction decision of every tier that shares the
    registry; nothing needs a restart.
    """

    def __init__(self, section_name: str = "quotas") -> None:
        self._section_name = section_name
        self._lock = threading.Lock()
        self._limits: dict[str, int] = {}
        self._default_limit_bytes: int | None = None

    def set_quota(self, cache_salt: str, limit_bytes: int) -> None:
        """Create or update ``cache_salt``'s limit.  ``0`` is a valid limit (the entry is
        listed, and all the tenant's bytes are over quota).

        Raises:
            ValueError: a negative limit.
            TypeError: a limit that is not an int.
        """
        _check_limit(limit_bytes)
        with self._lock:
            self._limits[cache_salt] = limit_bytes

    def delete_quota(self, cache_salt: str) -> bool:
        """Remove ``cache_salt``'s entry; False when it had none."""
        with self._lock:
            return self._limits.pop(cache_salt, None) is not None

    def get_limit_bytes(self, cache_salt: str) -> int:
        """The allowlist lens: the registered limit, ``0`` for an unregistered salt."""
        with self._lock:
            return self._limits.get(cache_salt, 0)

    def set_default_limit_bytes(self, limit_bytes: int | None) -> None:
        """The limit :meth:`effective_limit_bytes` gives unregistered salts (``None``:
        exempt, the start-up value; ``0``: allowlist enforcement)."""
        if limit_bytes is not None:
            _check_limit(limit_bytes)
        with self._lock:
            self._default_limit_bytes = limit_bytes

    def get_default_limit_bytes(self) -> int | None:
        with self._lock:
            return self._default_limit_bytes

    def effective_limit_bytes(self, cache_salt: str) -> int | None:
        """The default-quota lens: the registered limit, else the default (``None`` =
        exempt from quota eviction)."""
        with self._lock:
            explicit = self._limits.get(cache_salt)
            return explicit if explicit is not None else self._default_limit_bytes

    def has_quota(self, cache_salt: str) -> bool:
        """Whether ``cache_salt`` has an explicit entry (even a zero one)."""
        with self._lock:
            return cache_salt in self._limits

    def list_quotas(self) -> list[QuotaEntry]:
        """A detached snapshot of every entry."""
        with self._lock:
            return [QuotaEntry(salt, limit) for salt, limit in self._limits.items()]

    @property
    def name(self) -> str:
        """The name of this registry's section in a saved document."""
        return self._section_name

    def capture(self) -> Mapping[str, object]:
        """The limits and the default, taken together (one lock hold)."""
        with self._lock:
            return {"limits": dict(self._limits), "default_limit_bytes": self._default_limit_bytes}

    def restore(self, state: Mapping[str, object]) -> None:
        """Replace the limits and the default with a :meth:`capture` value (checked)."""
        limits = cast("Mapping[str, int]", state["limits"])
        default = cast("int | None", state["default_limit_bytes"])
        for limit in limits.values():
            _check_limit(limit)
        if default is not None:
            _check_limit(default)
        with self._lock:
            self._limits = {str(salt): limit for salt, limit in limits.items()}
            self._default_limit_bytes = default


class SaltUsage:
    """One tier's resident bytes per salt and per key.

    The tier calls :meth:`add` / :meth:`remove` under its own lock as keys enter and
    leave; readers (HTTP, metrics, the IsolatedLRU policy) get consistent snapshots
    through this object's lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[Hashable, tuple[str, int]] = {}
        self._by_salt: dict[str, int] = {}

    def add(self, key: Hashable, nbytes: int) -> None:
        """``key`` (of ``nbytes``) became resident; a key already counted is replaced."""
        salt = salt_of(key)
        with self._lock:
            old = self._by_key.get(key)
            if old is not None:
                self._drop(old)
            self._by_key[key] = (salt, nbytes)
            self._by_salt[salt] = self._by_salt.get(salt, 0) + nbytes

    def remove(self, key: Hashable) -> None:
        """``key`` left the tier; an unknown key is ignored."""
        with self._lock:
            old = self._by_key.pop(key, None)
            if old is not None:
                self._drop(old)

    def _drop(self, entry: tuple[str, int]) -> None:
        salt, nbytes = entry
        left = self._by_salt[salt] - nbytes
        if left:
            self._by_salt[salt] = left
        else:
            del self._by_salt[salt]  # only salts with bytes are listed

    def size_of(self, key: Hashable) -> int:
        with self._lock:
            entry = self._by_key.get(key)
            return 0 if entry is None else entry[1]

    def bytes_of(self, cache_salt: str) -> int:
        with self._lock:
            return self._by_salt.get(cache_salt, 0)

    def bytes_by_salt(self) -> dict[str, int]:
        """Salt -> resident bytes, for every salt holding any (a copy)."""
        with self._lock:
            return dict(self._by_salt)

    def total_bytes(self) -> int:
        with self._lock:
            return sum(self._by_salt.values())


__all__ = ["QuotaEntry", "QuotaManager", "SaltUsage"]
