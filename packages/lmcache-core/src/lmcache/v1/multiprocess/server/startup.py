"""Building the cache server: validate every input, then make the storage and the handler.

Everything that can be refused (config, device selection, L2 adapters, disk folder, L1
size) is checked before anything is allocated; a construction that fails after that
removes every segment it made (a crash loop must not fill /dev/shm).  Segments left by
servers and workers that were killed are reclaimed first; L1's shared memory is reserved
whole before it is mapped, so a ``/dev/shm`` that filled up meanwhile is an error, not a
SIGBUS.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict

import torch

from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.state import CacheServerSettings
from lmcache.v1.multiprocess.server.tenants import (
    check_tenant_quotas_policy,
    quota_registrations,
    register_quotas,
    tenants_from_flags,
)
from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.multiprocess.wire.curve import server_keys_from_files
from lmcache.v1.multiprocess.wire.security import (
    admin_policy,
    check_run_script_exposure,
    http_security,
)
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.disk_folder import inspect_disk_folder
from lmcache.v1.storage_backend.redis.connection import RedisUnavailableError
from lmcache.v1.storage_backend.storage_manager import StorageManager, create_storage_backends
from lmcache.v1.storage_backend.tier_settings import parse_l2_adapter

__all__ = [
    "build_cache_server",
    "check_device_selection",
    "check_l1_fits",
    "parse_l2_adapter",
    "prefault_buffer",
]

logger = logging.getLogger(__name__)

# A prefault at least this large says what it does, how far it got and how long it took:
# 10 GiB take 5-19 s, which is otherwise a silent start-up.
PREFAULT_LOG_MIN_BYTES = 1024**3
# A progress line at each quarter, and at least this often in between.
PREFAULT_PROGRESS_SECONDS = 2.0
_PREFAULT_STEP_BYTES = 64 * 1024**2


def build_cache_server(config: MPServerConfig) -> MPCacheServer:
    """Storage (L1 with optional SHM, optional disk L2) and the server state around it.

    Every input is checked and the device backend resolved *before* anything is allocated;
    if construction fails after that, every segment made here is removed again (a crash
    loop must not fill /dev/shm).
    """
    from lmcache.v1.platform import get_device_spec
    from lmcache.v1.platform.cpu.shm import (
        reclaim_orphaned_segments,
        unlink_orphaned_segment,
        unlink_segment,
    )

    config.validate()
    check_device_selection()
    admin = admin_policy(
        config.enable_admin_ops,
        config.enable_http_cache_clear,
        config.admin_token,
        config.admin_token_file,
        os.environ,
    )
    check_run_script_exposure(
        config.run_script_api_enabled, config.http_host, config.http_port, admin
    )
    curve = server_keys_from_files(config.curve_secret_key_file, config.authorized_keys)
    tenants = tenants_from_flags(config.tenants_file, None if curve is None else curve.authorized)
    check_tenant_quotas_policy(tenants, config.eviction_policy)
    http = http_security(
        config.http_tls_certfile, config.http_tls_keyfile, config.http_read_token_file
    )
    tiers = config.tier_settings()  # every tier input checked; nothing allocated yet
    engine_config = tiers.config
    disk_path = engine_config.local_disk if tiers.disk_enabled else None
    if disk_path:
        inspect_disk_folder(disk_path, tiers.disk_adopt)  # refused before L1 memory exists
    shm_name = config.resolved_shm_name()
    reclaim_orphaned_segments()  # before the size check: what it frees counts
    check_l1_fits(engine_config.max_local_cpu_size, in_shm=shm_name is not None)
    shm_preexisting = shm_name is not None and _segment_exists(shm_name)
    backends: OrderedDict[str, StorageBackendInterface] = OrderedDict()
    storage: StorageManager | None = None
    try:
        try:
            backends = create_storage_backends(tiers, shm_name=shm_name)
        except RedisUnavailableError:
            raise  # names the Redis tier itself
        except OSError as exc:
            made = f"L1 and the disk tier at {disk_path!r}" if disk_path else "L1"
            raise OSError(f"cannot create {made}: {exc}") from exc
        storage = StorageManager(
            engine_config, backends=backends, store_policy=config.l2_store_policy
        )
        _prefault(storage)
        if register_quotas(tenants, storage.quota_manager):
            logger.info("tenant quotas registered: %s", dict(quota_registrations(tenants)))
        settings = CacheServerSettings(
            chunk_size=config.chunk_size,
            supported_transfer_mode=config.supported_transfer_mode,
            worker_reap_timeout_seconds=config.worker_reap_timeout_seconds,
            pending_transfer_timeout_seconds=config.pending_transfer_timeout_seconds,
            prepared_store_ttl_seconds=config.prepared_store_ttl_seconds(),
            session_ttl_seconds=config.session_ttl_seconds,
            prefetch_max_in_flight=config.l2_prefetch_max_in_flight,
            prefetch_wait_timeout_seconds=config.l2_prefetch_wait_timeout_seconds,
            prefetch_retain=config.l2_prefetch_policy == "retain",
            instance_id=config.instance_id,
            admin=admin,
            kv_event_log_size=config.kv_event_log_size,
            curve=curve,
            tenants=tenants,
            http=http,
        )
        return MPCacheServer(
            settings,
            storage,
            get_device_spec,
            unlink_orphaned_segment=unlink_orphaned_segment,
            enable_metrics=not config.disable_metrics,
            server_config=config,
        )
    except BaseException:
        _release_partial_storage(storage, backends)
        if shm_name is not None and not shm_preexisting:
            unlink_segment(shm_name)
        raise


def check_l1_fits(size_gb: float, in_shm: bool) -> None:
    """L1 is touched page by page at start-up: more than memory holds would end with the
    OOM killer.  In shared memory this is the early, friendly refusal; the guarantee is the
    reservation made when the segment is created (another process may fill /dev/shm
    between this check and then)."""
    from lmcache.v1.multiprocess.server_config import meminfo_available_bytes

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


def _prefault(storage: StorageManager) -> None:
    """Touch every L1 page now: first-touch faults on shared memory would otherwise land
    inside the first stores (several times slower than the copy itself).

    Only L1's own buffer is touched, and a shared-memory one was reserved whole when it was
    created, so no page touched here can be missing from ``/dev/shm``.
    """
    from lmcache.v1.platform.cpu.shm import SHM_DIR

    allocator = storage.get_memory_allocator()
    buffer = getattr(allocator, "buffer", None)
    if isinstance(buffer, torch.Tensor):
        shm_name = getattr(allocator, "shm_name", None)
        where = os.path.join(SHM_DIR, shm_name.lstrip("/")) if shm_name else "process memory"
        # A lazy L1 reserved only its usable part; the rest is touched as it grows.
        usable = getattr(allocator, "usable_bytes", buffer.numel())
        prefault_buffer(buffer[:usable], where)


def prefault_buffer(buffer: torch.Tensor, where: str) -> None:
    """Write every byte of the flat uint8 ``buffer`` once; a large one logs its progress."""
    total = buffer.numel()
    if total == 0:
        return
    say = logger.info if total >= PREFAULT_LOG_MIN_BYTES else logger.debug
    say("prefaulting L1: %.2f GiB in %s", total / 1024**3, where)
    started = last_said = time.monotonic()
    quarter = 0
    for start in range(0, total, _PREFAULT_STEP_BYTES):
        end = min(start + _PREFAULT_STEP_BYTES, total)
        buffer[start:end].zero_()
        now = time.monotonic()
        reached = end * 4 // total
        if end < total and (reached > quarter or now - last_said >= PREFAULT_PROGRESS_SECONDS):
            quarter, last_said = reached, now
            say("prefaulting L1: %d%% (%.1f s)", end * 100 // total, now - started)
    say("prefaulted L1 (%.2f GiB) in %.1f s", total / 1024**3, time.monotonic() - started)
