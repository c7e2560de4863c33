"""Building the cache server: validate every input, then make the storage and the handler.

Everything that can be refused (config, device selection, L2 adapters, disk folder, L1
size) is checked before anything is allocated; a construction that fails after that
removes every segment it made (a crash loop must not fill /dev/shm).
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from typing import Any

import torch

from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.multiprocess.config import MPServerConfig
from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.state import CacheServerSettings
from lmcache.v1.multiprocess.wire.security import admin_policy
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.disk_folder import inspect_disk_folder
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.storage_manager import (
    L1_NAME,
    StorageManager,
    create_storage_backends,
)

logger = logging.getLogger(__name__)


def build_cache_server(config: MPServerConfig) -> MPCacheServer:
    """Storage (L1 with optional SHM, optional disk L2) and the server state around it.

    Every input is checked and the device backend resolved *before* anything is allocated;
    if construction fails after that, every segment made here is removed again (a crash
    loop must not fill /dev/shm).
    """
    from lmcache.v1.platform import get_device_spec
    from lmcache.v1.platform.cpu.shm import unlink_orphaned_segment, unlink_segment

    config.validate()
    check_device_selection()
    admin = admin_policy(
        config.enable_admin_ops,
        config.enable_http_cache_clear,
        config.admin_token,
        config.admin_token_file,
        os.environ,
    )
    adapters = [parse_l2_adapter(raw) for raw in config.l2_adapters]
    disk_path, disk_size_gb = _disk_tier(config, adapters)
    disk_adopt = _disk_adopt(config, adapters)
    if disk_path:
        inspect_disk_folder(disk_path, disk_adopt)  # refused before L1 memory exists
    engine_config = LMCacheEngineConfig(
        chunk_size=config.chunk_size,
        max_local_cpu_size=config.resolved_l1_size_gb(),
        cache_policy=config.eviction_policy,
        local_disk=disk_path,
        max_local_disk_size=disk_size_gb,
        blocking_timeout_secs=config.blocking_timeout_secs,
        extra_config={"local_disk.adopt": True} if disk_adopt else None,
    )
    shm_name = config.resolved_shm_name()
    check_l1_fits(engine_config.max_local_cpu_size, in_shm=shm_name is not None)
    shm_preexisting = shm_name is not None and _segment_exists(shm_name)
    backends: OrderedDict[str, StorageBackendInterface] = OrderedDict()
    storage: StorageManager | None = None
    try:
        try:
            backends = create_storage_backends(engine_config, shm_name=shm_name)
        except OSError as exc:
            tiers = f"L1 and the disk tier at {disk_path!r}" if disk_path else "L1"
            raise OSError(f"cannot create {tiers}: {exc}") from exc
        _add_remote_adapters(adapters, backends)
        storage = StorageManager(engine_config, backends=backends)
        _prefault(storage)
        settings = CacheServerSettings(
            chunk_size=config.chunk_size,
            supported_transfer_mode=config.supported_transfer_mode,
            worker_reap_timeout_seconds=config.worker_reap_timeout_seconds,
            pending_transfer_timeout_seconds=config.pending_transfer_timeout_seconds,
            session_ttl_seconds=config.session_ttl_seconds,
            prefetch_max_in_flight=config.l2_prefetch_max_in_flight,
            prefetch_wait_timeout_seconds=config.l2_prefetch_wait_timeout_seconds,
            instance_id=config.instance_id,
            admin=admin,
        )
        return MPCacheServer(
            settings,
            storage,
            get_device_spec,
            unlink_orphaned_segment=unlink_orphaned_segment,
            enable_metrics=not config.disable_metrics,
        )
    except BaseException:
        _release_partial_storage(storage, backends)
        if shm_name is not None and not shm_preexisting:
            unlink_segment(shm_name)
        raise


def check_l1_fits(size_gb: float, in_shm: bool) -> None:
    """L1 is touched page by page at start-up: more than /dev/shm (or memory) holds would
    end in SIGBUS or the OOM killer, with the segment left behind."""
    from lmcache.v1.multiprocess.config import meminfo_available_bytes

    size = int(size_gb * 1024**3)
    if in_shm:
        from lmcache.v1.platform.cpu.shm import SHM_DIR

        st = os.statvfs(SHM_DIR)
        free = st.f_bavail * st.f_frsize
        where = f"free space in {SHM_DIR}"
    else:
        free = meminfo_available_bytes() or size
        where = "available memory"
    if size > free:
        raise ValueError(
            f"--l1-size-gb {size_gb:g} does not fit: {where} is {free / 1024**3:.2f} GiB"
        )


def check_device_selection() -> None:
    """The selected device backend (``LMCACHE_DEVICE_BACKEND``, else by priority) must
    resolve: a bad selection is refused before anything is allocated."""
    from lmcache.v1.platform import get_selection

    get_selection()


def _segment_exists(shm_name: str) -> bool:
    from lmcache.v1.platform.cpu.shm import SHM_DIR

    return os.path.exists(os.path.join(SHM_DIR, shm_name.lstrip("/")))


def _release_partial_storage(
    storage: StorageManager | None, backends: OrderedDict[str, StorageBackendInterface]
) -> None:
    """Close what a failed construction made (L1's close unlinks its segment)."""
    try:
        if storage is not None:
            storage.close()
            return
        for backend in reversed(list(backends.values())):
            backend.close()
    except Exception:
        logger.exception("cleanup after a failed start-up")


_DISK_ADAPTER_TYPES = ("disk", "fs")
_DEFAULT_DISK_ADAPTER_SIZE_GB = 10.0


def parse_l2_adapter(raw: str) -> dict[str, Any]:
    """One ``--l2-adapter`` JSON object; errors name the flag and the bad value."""
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--l2-adapter {raw!r} is not valid JSON: {exc}") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise ValueError(f'--l2-adapter {raw!r} must be a JSON object with a "type"')
    from lmcache.v1.storage_backend.redis.settings import L2_ADAPTER_TYPES

    known = (*L2_ADAPTER_TYPES, *_DISK_ADAPTER_TYPES)
    if spec["type"] not in known:
        raise ValueError(
            f"--l2-adapter type {spec['type']!r} is not supported; supported: {', '.join(known)}"
        )
    return spec


def _disk_tier(config: MPServerConfig, adapters: list[dict[str, Any]]) -> tuple[str | None, float]:
    """(path, size GB) of the disk tier from --l2-disk-* or a disk adapter (one at most)."""
    disks = [a for a in adapters if a["type"] in _DISK_ADAPTER_TYPES]
    if config.l2_disk_path and config.l2_disk_size_gb > 0:
        disks.insert(0, {"path": config.l2_disk_path, "size_gb": config.l2_disk_size_gb})
    if len(disks) > 1:
        raise ValueError("only one disk tier is supported (--l2-disk-path or one disk adapter)")
    if not disks:
        return None, 0.0
    disk = disks[0]
    if not isinstance(disk.get("path"), str) or not disk["path"]:
        raise ValueError('--l2-adapter of type disk needs a "path"')
    size = float(disk.get("size_gb", _DEFAULT_DISK_ADAPTER_SIZE_GB))
    if size <= 0:
        raise ValueError(f"--l2-adapter disk size_gb must be positive, got {size}")
    return disk["path"], size


def _disk_adopt(config: MPServerConfig, adapters: list[dict[str, Any]]) -> bool:
    """Whether the disk tier may adopt a folder holding foreign files (--l2-disk-adopt or
    ``"adopt": true`` in the disk adapter)."""
    adopt = config.l2_disk_adopt
    for spec in adapters:
        if spec["type"] in _DISK_ADAPTER_TYPES and "adopt" in spec:
            if not isinstance(spec["adopt"], bool):
                raise ValueError(
                    f'--l2-adapter disk "adopt" must be true or false, got {spec["adopt"]!r}'
                )
            adopt = adopt or spec["adopt"]
    return adopt


def _add_remote_adapters(
    adapters: list[dict[str, Any]], backends: OrderedDict[str, StorageBackendInterface]
) -> None:
    from lmcache.v1.storage_backend.redis.factory import create_from_l2_adapter
    from lmcache.v1.storage_backend.redis.settings import L2_ADAPTER_TYPES

    cpu = backends[L1_NAME]
    assert isinstance(cpu, LocalCPUBackend)
    for index, spec in enumerate(a for a in adapters if a["type"] in L2_ADAPTER_TYPES):
        backends[f"L2Adapter{index}:{spec['type']}"] = create_from_l2_adapter(spec, cpu)
        logger.info("L2 adapter %d: %s tier added", index, spec["type"])


def _prefault(storage: StorageManager) -> None:
    """Touch every L1 page now: first-touch faults on shared memory would otherwise land
    inside the first stores (several times slower than the copy itself)."""
    buffer = getattr(storage.get_memory_allocator(), "buffer", None)
    if isinstance(buffer, torch.Tensor):
        step = 64 * 1024**2
        for start in range(0, buffer.numel(), step):
            buffer[start : start + step].zero_()
