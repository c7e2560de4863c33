"""Which storage tiers to build, and how: one small settings object built from either config.

The engine configuration (YAML / ``LMCACHE_*``: :meth:`TierSettings.from_engine_config`)
and the cache server's flags (``--l1-size-gb``, ``--l2-disk-*``, ``--l2-adapter``:
:meth:`TierSettings.from_server_flags`) both become a :class:`TierSettings`, and
:func:`~lmcache.v1.storage_backend.storage_manager.create_storage_backends` builds the tiers
from it -- one code path, whichever config they came from.  Building the settings checks
every input (adapter JSON, one disk tier at most, Redis options) before any memory exists.

Storage never imports the server: the server passes its flag values as arguments.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.storage_backend.l1_settings import STORE_POLICIES, L1Settings
from lmcache.v1.storage_backend.l2_adapters.bridge import check_bridge_eviction
from lmcache.v1.storage_backend.l2_adapters.config import (
    L2AdapterConfigBase,
    get_registered_l2_adapter_types,
    parse_adapter_spec,
)
from lmcache.v1.storage_backend.redis.settings import L2_ADAPTER_TYPES, RedisSettings, is_redis_url
from lmcache.v1.storage_backend.serde import SerdeConfig, build_chunk_serde, parse_serde_config

logger = logging.getLogger(__name__)

DISK_ADAPTER_TYPES = ("disk", "fs")
DEFAULT_DISK_ADAPTER_SIZE_GB = 10.0
REMOTE_NAME = "RemoteBackend"
"""Upstream's name of the tier that ``remote_url`` configures."""
ADOPT_OPTION = "local_disk.adopt"

_ABSENT = "which this build does not ship"
UNAVAILABLE_ADAPTER_TYPES: Mapping[str, str] = {
    "s3": f"needs an S3 object store and upstream's AWS CRT client, {_ABSENT}",
    "p2p": "needs peers speaking upstream's MP-server controller protocol, which this server "
    "does not speak",
    "nixl_store": f"needs NVIDIA NIXL (GPU-direct storage transfer), {_ABSENT}",
    "nixl_store_dynamic": f"needs NVIDIA NIXL (GPU-direct storage transfer), {_ABSENT}",
    "nixl_native": f"needs NVIDIA NIXL (GPU-direct storage transfer), {_ABSENT}",
    "mooncake_store": f"needs a Mooncake store cluster and its client library, {_ABSENT}",
    "dax": "needs a DAX (persistent-memory) device, which this machine does not have",
    "raw_block": f"needs a raw block device and upstream's Rust I/O extension, {_ABSENT}",
    "fs_native": f"needs upstream's C++ file connector, {_ABSENT}; type fs is the disk tier",
    "native_connector": f"needs upstream's C++ connector extension, {_ABSENT}",
    "native_plugin": f"needs a C++ connector built against upstream's native ABI, {_ABSENT}",
    "hf3fs": f"needs the 3FS distributed file system and its client, {_ABSENT}",
    "hfbucket": f"needs a Hugging Face storage bucket client, {_ABSENT}",
    "bigtable": f"needs Google Cloud Bigtable and its client, {_ABSENT}",
    "aerospike": f"needs an Aerospike cluster and its client, {_ABSENT}",
    "sagemaker_hyperpod": f"needs an AWS SageMaker HyperPod cluster client, {_ABSENT}",
}
"""Upstream adapter types that need hardware or a service absent here: type -> why."""


@dataclass(frozen=True)
class AdapterTier:
    """A tier driven through the L2 adapter interface (the bridge): its name among the
    backends and its parsed adapter config."""

    name: str
    config: L2AdapterConfigBase
    serde: SerdeConfig | None = None
    """The adapter's ``"serde"`` (wraps the bridged tier), or None."""


@dataclass(frozen=True)
class RemoteTier:
    """A Redis tier to build: its name among the backends, and its options."""

    name: str
    settings: RedisSettings
    serde: SerdeConfig | None = None


@dataclass(frozen=True)
class TierSettings:
    """The tiers to build.  ``config`` is what L1, the disk tier and the storage plugins
    read (their constructors keep upstream's signatures); ``remote`` are the Redis tiers."""

    config: LMCacheEngineConfig
    remote: tuple[RemoteTier, ...] = ()
    l1: L1Settings | None = None
    """How L1 manages its memory (the server's upstream storage-manager flags); None: as
    the engine config says (on-demand eviction only)."""
    store_policy: str = "default"
    """``--l2-store-policy`` (:data:`~.l1_settings.STORE_POLICIES`)."""
    adapters: tuple[AdapterTier, ...] = ()
    disk_serde: SerdeConfig | None = None
    """The disk tier's ``"serde"`` (from its ``--l2-adapter``), or None."""

    @property
    def disk_enabled(self) -> bool:
        return bool(self.config.local_disk) and self.config.max_local_disk_size > 0

    @property
    def disk_adopt(self) -> bool:
        """Whether the disk tier may use a folder holding files it did not write."""
        return bool(self.config.get_extra_config_value(ADOPT_OPTION, False))

    @classmethod
    def from_engine_config(cls, config: LMCacheEngineConfig) -> TierSettings:
        """L1, disk and plugins as ``config`` says; ``remote_url`` (redis:// or rediss://)
        adds the Redis tier as "RemoteBackend"."""
        remote: tuple[RemoteTier, ...] = ()
        if config.remote_url is not None:
            if is_redis_url(config.remote_url):
                remote = (RemoteTier(REMOTE_NAME, RedisSettings.from_config(config)),)
            else:
                logger.warning(
                    "remote_url %r: no remote backend for it; ignored", config.remote_url
                )
        return cls(config, remote)

    @classmethod
    def from_server_flags(
        cls,
        *,
        chunk_size: int,
        l1_size_gb: float,
        eviction_policy: str,
        blocking_timeout_secs: int,
        l2_disk_path: str | None = None,
        l2_disk_size_gb: float = 0.0,
        l2_disk_adopt: bool = False,
        l2_adapters: Sequence[str] = (),
        l1: L1Settings | None = None,
        store_policy: str = "default",
    ) -> TierSettings:
        """The tiers of ``lmcache server``: L1, the disk tier from ``--l2-disk-*`` or one
        disk adapter, a Redis tier per Redis ``--l2-adapter`` ("L2Adapter<i>:<type>", i
        counting Redis adapters), and a bridged tier per adapter-interface ``--l2-adapter``
        (mock, plugin, fault_inject, ...; "L2Adapter<i>:<type>", i its flag position)."""
        if store_policy not in STORE_POLICIES:
            raise ValueError(
                f"--l2-store-policy {store_policy!r} is not one of {', '.join(STORE_POLICIES)}"
            )
        if l1 is not None:
            l1.validate()
        adapters = [parse_l2_adapter(raw) for raw in l2_adapters]
        serdes = [adapter_serde(a) for a in adapters]
        disk_path, disk_size_gb = disk_tier(l2_disk_path, l2_disk_size_gb, adapters)
        adopt = disk_adopt(l2_disk_adopt, adapters)
        config = LMCacheEngineConfig(
            chunk_size=chunk_size,
            max_local_cpu_size=l1_size_gb,
            cache_policy=eviction_policy,
            local_disk=disk_path,
            max_local_disk_size=disk_size_gb,
            blocking_timeout_secs=blocking_timeout_secs,
            extra_config={ADOPT_OPTION: True} if adopt else None,
        )
        redis_specs = [(a, s) for a, s in zip(adapters, serdes) if a["type"] in L2_ADAPTER_TYPES]
        remote = tuple(
            RemoteTier(f"L2Adapter{i}:{spec['type']}", RedisSettings.from_l2_adapter(spec), serde)
            for i, (spec, serde) in enumerate(redis_specs)
        )
        disk_serdes = [s for a, s in zip(adapters, serdes) if a["type"] in DISK_ADAPTER_TYPES]
        return cls(
            config,
            remote,
            l1,
            store_policy,
            interface_adapter_tiers(adapters, serdes),
            disk_serdes[0] if disk_serdes else None,
        )


def parse_l2_adapter(raw: str) -> dict[str, Any]:
    """One ``--l2-adapter`` JSON object; errors name the flag and the bad value."""
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--l2-adapter {raw!r} is not valid JSON: {exc}") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise ValueError(f'--l2-adapter {raw!r} must be a JSON object with a "type"')
    kind = spec["type"]
    if kind in UNAVAILABLE_ADAPTER_TYPES:
        raise ValueError(
            f"--l2-adapter type {kind!r} is not available here: it "
            f"{UNAVAILABLE_ADAPTER_TYPES[kind]}"
        )
    known = (*L2_ADAPTER_TYPES, *DISK_ADAPTER_TYPES, *get_registered_l2_adapter_types())
    if kind not in known:
        raise ValueError(
            f"--l2-adapter type {kind!r} is not supported; supported: {', '.join(known)}"
        )
    return spec


def is_interface_adapter(spec: Mapping[str, Any]) -> bool:
    """Whether ``spec`` is served through the L2 adapter interface (not Redis or disk)."""
    return spec["type"] not in (*L2_ADAPTER_TYPES, *DISK_ADAPTER_TYPES)


def interface_adapter_tiers(
    adapters: Sequence[dict[str, Any]], serdes: Sequence[SerdeConfig | None] = ()
) -> tuple[AdapterTier, ...]:
    """The bridged tiers of parsed ``--l2-adapter`` specs, each config checked now (before
    any memory exists).  ``serdes[i]`` is adapter ``i``'s ``"serde"`` (taken out of its spec
    by :func:`adapter_serde`); the tier is wrapped with it."""
    tiers = []
    for i, spec in enumerate(adapters):
        if not is_interface_adapter(spec):
            continue
        config = parse_adapter_spec(spec, f"--l2-adapter #{i + 1}")
        name = f"L2Adapter{i}:{spec['type']}"
        check_bridge_eviction(config.eviction_config, f"--l2-adapter #{i + 1} ({name})")
        serde = serdes[i] if i < len(serdes) else None
        tiers.append(AdapterTier(name, config, serde))
    return tuple(tiers)


def adapter_serde(spec: dict[str, Any]) -> SerdeConfig | None:
    """Take the ``"serde"`` object out of an adapter spec (the tier's own options stay);
    its errors -- unknown type or field, unreadable key -- name the adapter, at start-up."""
    if "serde" not in spec:
        return None
    where = f"--l2-adapter type {spec['type']!r}"
    config = parse_serde_config(spec.pop("serde"), where)
    try:
        build_chunk_serde(config)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    return config


def disk_tier(
    path: str | None, size_gb: float, adapters: Sequence[Mapping[str, Any]]
) -> tuple[str | None, float]:
    """(path, size GB) of the disk tier from --l2-disk-* or a disk adapter (one at most)."""
    disks = [a for a in adapters if a["type"] in DISK_ADAPTER_TYPES]
    if path and size_gb > 0:
        disks.insert(0, {"path": path, "size_gb": size_gb})
    if len(disks) > 1:
        raise ValueError("only one disk tier is supported (--l2-disk-path or one disk adapter)")
    if not disks:
        return None, 0.0
    disk = disks[0]
    if not isinstance(disk.get("path"), str) or not disk["path"]:
        raise ValueError('--l2-adapter of type disk needs a "path"')
    size = float(disk.get("size_gb", DEFAULT_DISK_ADAPTER_SIZE_GB))
    if size <= 0:
        raise ValueError(f"--l2-adapter disk size_gb must be positive, got {size}")
    return disk["path"], size


def disk_adopt(adopt_flag: bool, adapters: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the disk tier may adopt a folder holding foreign files (--l2-disk-adopt or
    ``"adopt": true`` in the disk adapter)."""
    adopt = adopt_flag
    for spec in adapters:
        if spec["type"] in DISK_ADAPTER_TYPES and "adopt" in spec:
            if not isinstance(spec["adopt"], bool):
                raise ValueError(
                    f'--l2-adapter disk "adopt" must be true or false, got {spec["adopt"]!r}'
                )
            adopt = adopt or spec["adopt"]
    return adopt
