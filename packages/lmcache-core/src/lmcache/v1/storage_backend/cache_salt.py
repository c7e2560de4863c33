"""Which tenant (``cache_salt``) a stored chunk belongs to, as the storage tiers see it.

The salt is already folded into every chunk hash (so two tenants' equal prompts are two
keys), but the tiers need it in the clear too: quotas and per-tenant eviction count bytes
per salt, and per-salt encryption derives its key from it.  The server attaches it to each
storage key as a request config that is *not* part of the key's identity (only
``lmcache.tag.*`` entries are), so attaching it changes neither hashes nor lookups.

A key stored before the salt was attached, or adopted from disk after a restart, reads
as the empty salt (the shared, unsalted tenant).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CACHE_SALT_CONFIG = "lmcache.cache_salt"
"""The request-config entry that carries a key's ``cache_salt``."""


def salt_of(key: Any) -> str:
    """The ``cache_salt`` a storage key was stored under ("" when none)."""
    configs = getattr(key, "request_configs", None)
    if not configs:
        return ""
    return str(configs.get(CACHE_SALT_CONFIG, ""))


def configs_with_salt(request_configs: Mapping[str, Any] | None, cache_salt: str) -> dict[str, Any]:
    """``request_configs`` plus the salt entry (a new dict; the unsalted case adds nothing)."""
    configs = dict(request_configs or {})
    if cache_salt:
        configs[CACHE_SALT_CONFIG] = cache_salt
    return configs
