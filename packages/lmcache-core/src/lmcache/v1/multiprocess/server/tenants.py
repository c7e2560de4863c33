"""Tenants bound to client keys (``--tenants-file``): who may touch which cache salts.

With CURVE keys (:mod:`lmcache.v1.multiprocess.wire.curve`) the server knows which
authorized key sent each request.  The tenants file maps every authorized key to one
tenant, and the tenant says what that key may do:

* ``models``: the model names it may register and use (omitted or ``"*"``: any);
* ``salts`` / ``salt_prefix``: the cache salts it owns -- it stores, looks up and retrieves
  only under them, and a request without a salt is served under its ``default_salt``;
* ``shares``: salts it may look up and retrieve but never write (a system-prompt cache
  written only by its owner);
* ``quota_bytes``: the bytes each of its salts may hold in the cache (registered in the
  per-salt quota machinery, see :func:`quota_registrations`);
* ``admin``: whether it may run admin operations (``clear``) where they are enabled.

Salts are folded into every chunk hash, so a tenant that can name only its own salts can
neither read, plant nor probe another tenant's chunks; every refusal is decided from the
request and the tenants file alone, before storage is consulted, so its reply and timing
say nothing about what is cached.  Registered workers and lookup sessions belong to the
tenant that made them.

Example (YAML; JSON works too)::

    tenants:
      team-a:
        keys: [alice]               # NAME of NAME.key in --authorized-keys, or a Z85 key
        models: [meta-llama/Llama-3.1-8B]
        salts: [team-a]
        salt_prefix: "team-a-"
        quota_bytes: 10737418240
        shares: [public-prompts]
      publisher:
        keys: [publisher]
        salts: [public-prompts]
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from lmcache.v1.multiprocess.wire.custom_types import validate_cache_salt

logger = logging.getLogger(__name__)

ANY_MODEL = "*"
_FIELDS = frozenset(
    {"keys", "models", "salts", "salt_prefix", "default_salt", "quota_bytes", "shares", "admin"}
)


class TenantsFileError(ValueError):
    """The tenants file is unusable; the message names the file and the entry."""


@dataclasses.dataclass(frozen=True)
class Tenant:
    """What one tenant's keys may do (see the module docstring)."""

    name: str
    keys: frozenset[str]
    models: frozenset[str] | None  # None: any model
    salts: frozenset[str]
    salt_prefix: str
    default_salt: str
    quota_bytes: int | None
    shares: frozenset[str]
    admin: bool = False

    def may_use_model(self, model_name: str) -> bool:
        return self.models is None or model_name in self.models

    def owns(self, salt: str) -> bool:
        return salt in self.salts or bool(self.salt_prefix and salt.startswith(self.salt_prefix))

    def may_read(self, salt: str) -> bool:
        return self.owns(salt) or salt in self.shares

    def salt_for(self, requested: str) -> str:
        """The salt a request is served under: its own, else the tenant's default."""
        return requested or self.default_salt


@dataclasses.dataclass(frozen=True)
class TenantTable:
    """Every tenant, and each authorized key's tenant (Z85 public key -> tenant)."""

    tenants: tuple[Tenant, ...]
    by_key: Mapping[str, Tenant]

    def for_key(self, key: str | None) -> Tenant | None:
        return None if key is None else self.by_key.get(key)

    def names(self) -> list[str]:
        return [t.name for t in self.tenants]


# How each operation treats a tenant (docs/server.md has the table); a test keeps this in
# step with the RPC table, so a new operation must decide.
_KEY_READ = "key: tenant's model, a salt it owns or shares"
_KEY_WRITE = "key: tenant's model, a salt it owns"
_OWN_WORKER = "instance id: the tenant's own workers only"
_SESSION = "request id: the tenant's own lookup sessions only"
TENANT_RULES: dict[str, str] = {
    "register_kv_cache": "model; no other tenant's instance id or KV memory",
    "register_kv_cache_engine_driven_context": "model; no other tenant's instance id; no SHM",
    "unregister_kv_cache": _OWN_WORKER,
    "unregister_kv_cache_engine_driven_context": _OWN_WORKER,
    "set_engine_driven_sub_path": _OWN_WORKER + "; never SHM",
    "ping": _OWN_WORKER,
    "store": _KEY_WRITE + "; " + _OWN_WORKER,
    "prepare_store": _KEY_WRITE + "; " + _OWN_WORKER,
    "commit_store": _KEY_WRITE + "; " + _OWN_WORKER,
    "commit_store_frames": _KEY_WRITE + "; " + _OWN_WORKER,
    "retrieve": _KEY_READ + "; " + _OWN_WORKER,
    "prepare_retrieve": _KEY_READ + "; " + _OWN_WORKER,
    "commit_retrieve": _KEY_READ + "; " + _OWN_WORKER,
    "retrieve_frames": _KEY_READ + "; " + _OWN_WORKER,
    "lookup": _KEY_READ + "; " + _SESSION,
    "free_lookup_locks": _SESSION,
    "end_session": _SESSION,
    "query_prefetch_status": _SESSION,
    "wait_prefetch_status": _SESSION,
    "query_prefetch_progress": _SESSION,
    "put_objects": "model; write salt",
    "get_objects": "model; read salt",
    "count_object_prefix": "model; read salt",
    "subscribe_kv_events": "model; events of readable salts only",
    "get_stats": "the server's shape only, no counters",
    "clear": "tenants with admin: true only",
    "report_block_allocation": "accepted and ignored (nothing is read or changed)",
    "get_chunk_size": "open: a server-wide constant",
    "noop": "open",
    "get_experimental": "open: capabilities",
    "protocol_handshake": "open: the protocol version",
}


# -- the caller of the request being handled -------------------------------------------------

# Set by the transport around each handler call; None outside requests (reaping, HTTP) and
# on a server without tenants.
_CURRENT: contextvars.ContextVar[Tenant | None] = contextvars.ContextVar(
    "lmcache_tenant", default=None
)


def current_tenant() -> Tenant | None:
    """The tenant whose request this thread is handling (None: no tenants, or internal)."""
    return _CURRENT.get()


@contextlib.contextmanager
def calling_as(tenant: Tenant | None) -> Iterator[None]:
    token = _CURRENT.set(tenant)
    try:
        yield
    finally:
        _CURRENT.reset(token)


# -- the per-salt quotas ---------------------------------------------------------------------


def quota_registrations(table: TenantTable | None) -> list[tuple[str, int]]:
    """``(cache_salt, limit_bytes)`` for every exact salt of every tenant with a quota: what
    to register in the per-salt quota machinery (``QuotaManager.set_quota``) at start-up.

    A tenant's quota applies to each of its exact salts (its ``salts`` and its default
    salt).  Salts it owns only through ``salt_prefix`` are not listed: the per-salt
    machinery knows no prefixes.
    """
    if table is None:
        return []
    pairs: list[tuple[str, int]] = []
    for tenant in table.tenants:
        if tenant.quota_bytes is None:
            continue
        for salt in sorted(tenant.salts | {tenant.default_salt}):
            pairs.append((salt, tenant.quota_bytes))
    return pairs


class SupportsSetQuota(Protocol):
    """The per-salt quota machinery, as far as tenants need it (upstream's
    ``QuotaManager.set_quota``)."""

    def set_quota(self, cache_salt: str, limit_bytes: int) -> None: ...


def register_quotas(table: TenantTable | None, quotas: SupportsSetQuota) -> int:
    """Register every pair of :func:`quota_registrations` in ``quotas``; how many."""
    pairs = quota_registrations(table)
    for salt, limit in pairs:
        quotas.set_quota(salt, limit)
    return len(pairs)


def check_tenant_quotas_policy(table: TenantTable | None, eviction_policy: str) -> None:
    """Tenant quotas act through ``IsolatedLRU`` (a tenant over its quota gives up only its
    own chunks); under any other policy they would be silently ignored, so refuse."""
    if quota_registrations(table) and eviction_policy != "IsolatedLRU":
        raise ValueError(
            "--tenants-file gives tenants a quota_bytes, which only --eviction-policy "
            f"IsolatedLRU enforces (it is {eviction_policy}); set --eviction-policy "
            "IsolatedLRU or drop the quotas"
        )


# -- the file --------------------------------------------------------------------------------


def _read_document(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise TenantsFileError(f"--tenants-file {path}: cannot read it ({reason})") from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        import yaml

        return yaml.safe_load(text)
    except ValueError as exc:  # json.JSONDecodeError
        raise TenantsFileError(f"--tenants-file {path}: not valid JSON ({exc})") from None
    except Exception as exc:  # yaml.YAMLError
        raise TenantsFileError(f"--tenants-file {path}: not valid YAML ({exc})") from None


def _strings(where: str, field: str, value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TenantsFileError(f"{where}: {field} must be a list of non-empty strings")
    return list(value)


def _salt(where: str, field: str, salt: str) -> str:
    try:
        validate_cache_salt(salt)
    except ValueError as exc:
        raise TenantsFileError(f"{where}: {field} {salt!r}: {exc}") from None
    return salt


def _resolve_key(where: str, ref: str, authorized: Mapping[bytes, str]) -> str:
    """A key reference -> the Z85 key: the name of a ``NAME.key`` in --authorized-keys,
    or the Z85 public key itself (which must be authorized too)."""
    for key, name in authorized.items():
        if ref == name or ref.encode() == key:
            return key.decode()
    raise TenantsFileError(
        f"{where}: key {ref!r} is neither the name of a .key file in --authorized-keys nor "
        f"an authorized public key"
    )


def _tenant(where: str, name: str, entry: Any, authorized: Mapping[bytes, str]) -> Tenant:
    if not isinstance(entry, dict):
        raise TenantsFileError(f"{where}: a tenant is a mapping of {sorted(_FIELDS)}")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise TenantsFileError(f"{where}: unknown field(s) {unknown}; known: {sorted(_FIELDS)}")
    keys = frozenset(
        _resolve_key(where, ref, authorized) for ref in _strings(where, "keys", entry.get("keys"))
    )
    models_raw = entry.get("models", ANY_MODEL)
    models = None if models_raw == ANY_MODEL else frozenset(_strings(where, "models", models_raw))
    salts = frozenset(
        _salt(where, "salts", s) for s in _strings(where, "salts", entry.get("salts", []))
    )
    prefix = _salt(where, "salt_prefix", str(entry.get("salt_prefix") or ""))
    if not salts and not prefix:
        raise TenantsFileError(f"{where}: give the salts it owns (salts and/or salt_prefix)")
    default = entry.get("default_salt") or (sorted(salts)[0] if salts else prefix)
    quota = entry.get("quota_bytes")
    if quota is not None and (isinstance(quota, bool) or not isinstance(quota, int) or quota <= 0):
        raise TenantsFileError(f"{where}: quota_bytes must be a positive integer, got {quota!r}")
    admin = entry.get("admin", False)
    if not isinstance(admin, bool):
        raise TenantsFileError(f"{where}: admin must be true or false, got {admin!r}")
    tenant = Tenant(
        name=name,
        keys=keys,
        models=models,
        salts=salts,
        salt_prefix=prefix,
        default_salt=_salt(where, "default_salt", str(default)),
        quota_bytes=quota,
        shares=frozenset(_strings(where, "shares", entry.get("shares", []))),
        admin=admin,
    )
    if not tenant.owns(tenant.default_salt):
        raise TenantsFileError(f"{where}: default_salt {default!r} is not one of its salts")
    return tenant


def _check_disjoint(path: Path, tenants: list[Tenant]) -> None:
    """No salt may have two owners: either could plant chunks the other reads."""
    for i, a in enumerate(tenants):
        for b in tenants[i + 1 :]:
            clash = sorted(s for s in a.salts if b.owns(s)) + sorted(
                s for s in b.salts if a.owns(s)
            )
            prefixes = a.salt_prefix and b.salt_prefix
            if prefixes and (
                a.salt_prefix.startswith(b.salt_prefix) or b.salt_prefix.startswith(a.salt_prefix)
            ):
                clash.append(f"prefixes {a.salt_prefix!r} / {b.salt_prefix!r}")
            if clash:
                raise TenantsFileError(
                    f"--tenants-file {path}: tenants {a.name!r} and {b.name!r} both own "
                    f"{clash}; every salt needs exactly one owner"
                )


def load_tenants(path: str | Path, authorized: Mapping[bytes, str]) -> TenantTable:
    """The tenants file checked against the authorized keys; raises
    :class:`TenantsFileError`.  Every authorized key must belong to exactly one tenant."""
    file = Path(path)
    document = _read_document(file)
    section = document.get("tenants") if isinstance(document, dict) else None
    if not isinstance(section, dict) or not section:
        raise TenantsFileError(
            f"--tenants-file {file}: expected a top-level 'tenants' mapping of tenant names "
            f"to entries (see docs/server.md)"
        )
    tenants = [
        _tenant(f"--tenants-file {file}: tenant {name!r}", str(name), entry, authorized)
        for name, entry in section.items()
    ]
    _check_disjoint(file, tenants)
    by_key: dict[str, Tenant] = {}
    for tenant in tenants:
        for key in tenant.keys:
            if key in by_key:
                raise TenantsFileError(
                    f"--tenants-file {file}: key {authorized[key.encode()]!r} belongs to "
                    f"tenants {by_key[key].name!r} and {tenant.name!r}; give it one"
                )
            by_key[key] = tenant
    orphans = sorted(name for key, name in authorized.items() if key.decode() not in by_key)
    if orphans:
        raise TenantsFileError(
            f"--tenants-file {file}: authorized key(s) {orphans} belong to no tenant; with "
            f"tenants, every key in --authorized-keys needs one"
        )
    logger.info("tenants: %s", ", ".join(t.name for t in tenants))
    return TenantTable(tuple(tenants), by_key)


def tenants_from_flags(
    tenants_file: str | None, authorized: Mapping[bytes, str] | None
) -> TenantTable | None:
    """``--tenants-file`` against the keys of ``--authorized-keys`` (None without it)."""
    if not tenants_file:
        return None
    if authorized is None:
        raise TenantsFileError(
            "--tenants-file needs --curve-secret-key-file and --authorized-keys: tenants are "
            "bound to authenticated client keys"
        )
    return load_tenants(tenants_file, authorized)
