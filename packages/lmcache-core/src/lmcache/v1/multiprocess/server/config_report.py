"""What the cache server reports about its configuration: the ``GET /config`` document and
the ``GET /config/adapters`` listing of its L2 tiers, with every secret redacted
(:mod:`lmcache.v1.utils.secrets`, re-exported here).

Secrets are found by name and by shape, since a configuration document is read by people
who must not learn the admin token or a storage password from it:

* a mapping key whose words (``snake_case``, ``camelCase``, dotted or dashed) include
  ``password``, ``secret``, ``token``, ``credential(s)``, ``passphrase``, ``authorization``
  or ``api key`` / ``access key`` / ``private key`` has its value replaced by
  :data:`REDACTED` -- unless the key names where a secret is kept (last word ``file``,
  ``path``, ``dir`` or ``env``) or the value says nothing (``None``, a boolean);
* in a string, a URL's user information (``redis://user:pw@host`` keeps ``user``) and
  secret-named query parameters are redacted, and a string holding a JSON object (an
  ``--l2-adapter`` value) is redacted inside.

Storage does not know the server, so the tiers are read through their public attributes,
as :mod:`.tiers` does.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from typing import Any

from lmcache.v1.multiprocess.server.tiers import tier_kind
from lmcache.v1.storage_backend.storage_manager import L1_NAME, StorageManager
from lmcache.v1.storage_backend.tier_settings import DISK_ADAPTER_TYPES
from lmcache.v1.utils.json_utils import make_json_safe
from lmcache.v1.utils.secrets import REDACTED, is_secret_key, redact_secrets

__all__ = [
    "REDACTED",
    "is_secret_key",
    "l2_tiers",
    "list_l2_adapters",
    "redact_secrets",
    "server_configs",
]

# The L2 tier type of a Redis tier is in its name ("L2Adapter<i>:<type>", TierSettings).
_ADAPTER_NAME_PREFIX = "L2Adapter"
_L2_TIER = "l2"


def _plain(value: Any) -> Any:
    """Dataclasses to dicts and enums to their values, then JSON-safe."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    return make_json_safe(value)


def _adapter_specs(server_config: Any) -> list[Any]:
    """The ``--l2-adapter`` values as JSON objects (they were checked at start-up; one
    that does not parse is kept as its string, which redaction still scans)."""
    specs: list[Any] = []
    for raw in getattr(server_config, "l2_adapters", None) or ():
        try:
            specs.append(json.loads(raw) if isinstance(raw, str) else raw)
        except ValueError:
            specs.append(raw)
    return specs


def l2_tiers(storage: StorageManager) -> list[tuple[str, Any]]:
    """The tiers below L1, in the order a read consults them: ``(name, backend)``."""
    return [(n, b) for n, b in storage.storage_backends.items() if n != L1_NAME]


def _type_name(name: str, backend: Any, specs: Sequence[Any]) -> str:
    """The adapter type an operator configured the tier with (``--l2-adapter`` ``type``)."""
    if name.startswith(_ADAPTER_NAME_PREFIX) and ":" in name:
        return name.split(":", 1)[1]
    if tier_kind(name, backend) == "disk":
        for spec in specs:
            if isinstance(spec, dict) and spec.get("type") in DISK_ADAPTER_TYPES:
                return str(spec["type"])
        return "disk"  # --l2-disk-path
    return name  # a storage plugin: its name is all it has


def list_l2_adapters(storage: StorageManager, server_config: Any = None) -> list[dict[str, Any]]:
    """Upstream 0.5.6's ``/config/adapters`` entries for our L2 tiers, plus ``name`` (the
    tier's name in ``/status``).  ``primary`` is the first tier a read consults; no tier
    here can be reconfigured at run time."""
    specs = _adapter_specs(server_config)
    return [
        {
            "index": index,
            "type_name": _type_name(name, backend, specs),
            "tier": _L2_TIER,
            "primary": index == 0,
            "reconfigurable": False,
            "name": name,
        }
        for index, (name, backend) in enumerate(l2_tiers(storage))
    ]


def _describe_l2_tier(index: int, name: str, backend: Any, specs: Sequence[Any]) -> dict[str, Any]:
    info: dict[str, Any] = {
        "index": index,
        "name": name,
        "type_name": _type_name(name, backend, specs),
        "kind": tier_kind(name, backend),
    }
    capacity = getattr(backend, "capacity_bytes", None)
    if isinstance(capacity, int):
        info["capacity_bytes"] = capacity
    if info["kind"] == "disk":
        info["path"] = backend.path
    settings = getattr(backend, "settings", None)  # a Redis tier's options
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        info["options"] = _plain(settings)
    return info


def _storage_config(storage: StorageManager, server_config: Any) -> dict[str, Any]:
    specs = _adapter_specs(server_config)
    l1 = storage.local_cpu_backend
    return {
        "l1": {
            "name": L1_NAME,
            "capacity_bytes": int(l1.capacity_bytes),
            "eviction_policy": storage.config.cache_policy,
        },
        "l2_adapter_config": {
            "adapters": [
                _describe_l2_tier(i, name, backend, specs)
                for i, (name, backend) in enumerate(l2_tiers(storage))
            ]
        },
        # What the tiers were built from (the flags, as engine-config keys).
        "engine_config": _plain(storage.config),
    }


def server_configs(engine: Any) -> dict[str, Any]:
    """The ``GET /config`` document of a running cache server (redacted, JSON-safe).

    ``mp``: the ``lmcache server`` flags (:class:`.server_config.MPServerConfig`, present
    when the server was built from one), with the ``--l2-adapter`` values as objects;
    ``server``: the settings the server runs with; ``storage_manager``: its tiers.
    """
    server_config = getattr(engine, "server_config", None)
    configs: dict[str, Any] = {}
    if server_config is not None:
        mp = _plain(server_config)
        mp["l2_adapters"] = _plain(_adapter_specs(server_config))
        configs["mp"] = mp
    configs["server"] = _plain(engine.settings)
    configs["storage_manager"] = _storage_config(engine.storage, server_config)
    result: dict[str, Any] = redact_secrets(configs)
    return result
