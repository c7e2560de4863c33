"""L2: one file per chunk on a local file system, bounded by bytes, crash-safe.

A put writes the chunk's file on a thread pool, crash-safe (temporary file, fsync, rename,
folder fsync: :mod:`lmcache.v1.storage_backend.disk_files`).  The index (key -> file)
lives in memory and is rebuilt from the folder when the backend starts: unfinished writes
are deleted, objects that fail validation are deleted.

The tier owns its folder and touches nothing else in it (marker, own names, foreign
entries, adoption: :mod:`lmcache.v1.storage_backend.disk_folder`).  A folder holding
foreign entries is refused at start-up unless the tier is told to adopt it
(``extra_config["local_disk.adopt"]``, ``lmcache server --l2-disk-adopt`` or
``"adopt": true`` in a disk ``--l2-adapter``); adopted, it leaves them untouched and does
not count them against its size.

Each file holds one chunk in the format of :mod:`lmcache.v1.storage_backend.chunk_format`
(``LMCD`` prefix, XXH3-64 or CRC-32 sums, JSON header, payload).  A file whose header,
length or payload checksum does not match -- or whose checksum algorithm this process
cannot compute -- is logged, deleted and reported as a miss; a reader never sees its bytes.

Evictions (files dropped to make room, including at start-up when the folder holds more
than the tier's size) are counted in :attr:`LocalDiskBackend.evictions`; failed writes and
corrupt files in :attr:`LocalDiskBackend.errors`.

Health (:meth:`LocalDiskBackend.health_problems`): the tier is unhealthy while the last
``local_disk.unhealthy_after_failed_writes`` (default 3) writes in a row failed, or while
the file system has less free space than one chunk (the largest chunk file seen).  A
successful write -- or, while unhealthy and with room again, a chunk-sized trial write made
by the health check itself -- ends it.  Failed writes are logged at most once a minute per
kind of error, with the count left out.

This module is the index, the byte budget, eviction and pins; it also re-exports the
names of the chunk format and folder modules it was split from, so
``lmcache.v1.storage_backend.local_disk_backend`` keeps every name it had.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import torch

from lmcache.logging import RateLimitedLog
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig, LMCacheMetadata
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.storage_backend.abstract_backend import (
    AllocatorBackendInterface,
    StorageBackendInterface,
)
from lmcache.v1.storage_backend.cache_policy import get_cache_policy
from lmcache.v1.storage_backend.chunk_format import (
    CHECKSUM_CRC32,
    CHECKSUM_NAMES,
    CHECKSUM_XXH3_64,
    FORMAT_VERSION,
    FORMAT_VERSION_CRC32,
    MAGIC,
    PREFIX_SIZE,
    WRITE_CHECKSUM,
    CorruptFileError,
    PayloadChecksum,
    allocate_for_read,
    checksum,
    encode_header,
    encode_prefix,
    read_header,
)
from lmcache.v1.storage_backend.disk_files import (
    DiskEntry,
    read_chunk_file,
    scan_folder,
    unlink_quietly,
    write_chunk_file,
    write_trial_file,
)
from lmcache.v1.storage_backend.disk_folder import (
    FILE_SUFFIX,
    FOLDER_LAYOUT_VERSION,
    MARKER_NAME,
    TMP_SUFFIX,
    DiskFolderError,
    EntryKind,
    FolderState,
    classify_entry,
    file_name_for,
    fsync_directory,
    inspect_disk_folder,
    write_marker,
)
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.put_tasks import PutTasks
from lmcache.v1.storage_backend.quota import QuotaManager, SaltUsage

__all__ = [
    "CHECKSUM_CRC32",
    "CHECKSUM_NAMES",
    "CHECKSUM_XXH3_64",
    "FILE_SUFFIX",
    "FOLDER_LAYOUT_VERSION",
    "FORMAT_VERSION",
    "FORMAT_VERSION_CRC32",
    "MAGIC",
    "MARKER_NAME",
    "PREFIX_SIZE",
    "TMP_SUFFIX",
    "WRITE_CHECKSUM",
    "CorruptFileError",
    "DiskFolderError",
    "EntryKind",
    "FolderState",
    "LocalDiskBackend",
    "PayloadChecksum",
    "allocate_for_read",
    "checksum",
    "classify_entry",
    "encode_header",
    "encode_prefix",
    "file_name_for",
    "fsync_directory",
    "inspect_disk_folder",
    "read_header",
]

logger = logging.getLogger(__name__)

UNHEALTHY_AFTER_FAILED_WRITES = 3
"""Default of ``local_disk.unhealthy_after_failed_writes``: one failure may be a fluke
(a file removed under the tier); three in a row is a disk that does not take writes."""


class LocalDiskBackend(StorageBackendInterface):
    """Disk tier.  Reads allocate from ``local_cpu_backend`` (the L1 allocator).

    ``quota_manager``: the tenants' quota registry (``IsolatedLRU`` decides by it); by
    default L1's, so both tiers obey one set of quotas.  :attr:`salt_usage` counts this
    tier's indexed bytes per tenant.
    """

    queues_own_puts = True

    def __init__(
        self,
        config: LMCacheEngineConfig | None = None,
        local_cpu_backend: LocalCPUBackend | None = None,
        metadata: LMCacheMetadata | None = None,
        dst_device: str = "cpu",
        path: str | None = None,
        max_bytes: int | None = None,
        adopt: bool | None = None,
        *,
        quota_manager: QuotaManager | None = None,
    ) -> None:
        super().__init__(dst_device=dst_device)
        self.config = config if config is not None else LMCacheEngineConfig()
        self.metadata = metadata
        self.local_cpu_backend = local_cpu_backend
        self.path = path or self._pick_path()
        os.makedirs(self.path, exist_ok=True)
        self.capacity_bytes = (
            max_bytes if max_bytes is not None else self.config.local_disk_size_bytes
        )
        self._fsync = bool(self.config.get_extra_config_value("local_disk.fsync", True))
        if adopt is None:
            adopt = bool(self.config.get_extra_config_value("local_disk.adopt", False))
        self._claim_folder(adopt)
        workers = int(self.config.get_extra_config_value("local_disk.num_workers", 4))
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lmc-disk")
        self._lock = threading.Lock()
        self._index: dict[CacheEngineKey, DiskEntry] = {}
        if quota_manager is None:
            quota_manager = getattr(local_cpu_backend, "quota_manager", None) or QuotaManager()
        self.quota_manager = quota_manager
        self.salt_usage = SaltUsage()
        self._policy = get_cache_policy(
            self.config.cache_policy, quotas=self.quota_manager, usage=self.salt_usage
        )
        self._puts: PutTasks[CacheEngineKey] = PutTasks()
        self._used = 0
        self._evictions = 0
        self._errors = 0
        self._failed_in_a_row = 0
        self._last_failure = ""
        self._largest_chunk = 0
        self._unhealthy_after = int(
            self.config.get_extra_config_value(
                "local_disk.unhealthy_after_failed_writes", UNHEALTHY_AFTER_FAILED_WRITES
            )
        )
        if self._unhealthy_after < 1:
            raise ValueError("local_disk.unhealthy_after_failed_writes must be >= 1")
        self._failure_log = RateLimitedLog(logger)
        self._rebuild_index()

    def _pick_path(self) -> str:
        paths = self.config.local_disk_paths()
        if not paths:
            raise ValueError("LocalDiskBackend needs config key 'local_disk' (a directory)")
        worker = self.metadata.worker_id if self.metadata is not None else 0
        if self.config.local_disk_path_sharding == "by_gpu":
            return paths[worker % len(paths)]
        return paths[0]

    # -- start-up -----------------------------------------------------------------------------

    def _claim_folder(self, adopt: bool) -> None:
        """Refuse a folder with foreign entries (unless ``adopt``); write the marker."""
        state = inspect_disk_folder(self.path, adopt)
        if state.foreign:
            logger.warning(
                "disk tier %s adopted: %d foreign entries left untouched", self.path, state.foreign
            )
        if state.marked:
            return
        if state.earlier_version:
            logger.info("disk tier %s: files of an earlier version (no marker) adopted", self.path)
        write_marker(self.path)

    def _rebuild_index(self) -> None:
        found = scan_folder(self.path, self._fsync)
        with self._lock:
            for key, entry in found:
                self._index[key] = entry
                self.salt_usage.add(key, entry.file_size)
                self._policy.on_put(key)
                self._used += entry.file_size
                self._largest_chunk = max(self._largest_chunk, entry.file_size)
            self._evict_locked(0)
        if found:
            logger.info(
                "disk tier %s: %d objects (%d bytes) indexed", self.path, len(found), self._used
            )

    # -- writes -------------------------------------------------------------------------------

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return key in self._puts

    def batched_submit_put_task(
        self,
        keys: Sequence[CacheEngineKey],
        objs: list[MemoryObj],
        transfer_spec: Any = None,
        on_complete_callback: Callable[[CacheEngineKey], None] | None = None,
    ) -> list[Future] | None:
        if len(keys) != len(objs):
            raise ValueError(f"{len(keys)} keys but {len(objs)} objects")
        futures: list[Future] = []
        for key, obj in zip(keys, objs):
            header = json.dumps(encode_header(key, obj)).encode("utf-8")
            file_size = PREFIX_SIZE + len(header) + obj.get_size()
            with self._lock:
                if key in self._index or key in self._puts:
                    continue
                if not self._evict_locked(file_size):
                    logger.debug("disk tier full (pinned or in use): put of %s skipped", key)
                    continue
                self._used += file_size
                self._largest_chunk = max(self._largest_chunk, file_size)
                obj.ref_count_up()
                write = partial(self._write, key, obj, header, file_size, on_complete_callback)
                future = self._puts.start([key], partial(self._submit, write))
            if future is not None:
                futures.append(future)
        return futures

    def _submit(self, write: Callable[[], None], _keys: list[CacheEngineKey]) -> Future:
        return self._executor.submit(write)

    def _write(
        self,
        key: CacheEngineKey,
        obj: MemoryObj,
        header: bytes,
        file_size: int,
        on_complete_callback: Callable[[CacheEngineKey], None] | None,
    ) -> None:
        try:
            final = write_chunk_file(self.path, key, obj, header, self._fsync)
        except BaseException as exc:
            with self._lock:
                self._used -= file_size
                self._puts.finish([key])
            obj.ref_count_down()
            self._write_failed(exc)
            raise
        with self._lock:
            self._index[key] = DiskEntry(final, file_size, json.loads(header))
            self.salt_usage.add(key, file_size)
            self._policy.on_put(key)
            self._puts.finish([key])
        obj.ref_count_down()
        self._write_succeeded()
        if on_complete_callback is not None:
            on_complete_callback(key)

    def _write_failed(self, exc: BaseException) -> None:
        with self._lock:
            self._errors += 1
            self._failed_in_a_row += 1
            self._last_failure = f"{type(exc).__name__}: {exc}"
        # A full or broken disk fails every write: one line per kind and interval, with the
        # count; a traceback only for what is not an I/O error (a bug).
        code = exc.errno if isinstance(exc, OSError) else None
        kind = errno.errorcode.get(code, "OSError") if code is not None else ""
        self._failure_log.log(
            logging.WARNING,
            kind or type(exc).__name__,
            "disk tier %s: a chunk write failed: %s",
            self.path,
            self._last_failure,
            exc_info=None if isinstance(exc, OSError) else exc,
        )

    def _write_succeeded(self) -> None:
        with self._lock:
            failed, self._failed_in_a_row = self._failed_in_a_row, 0
        if failed >= self._unhealthy_after:
            logger.warning("disk tier %s: writes succeed again after %d failed", self.path, failed)

    def _evict_locked(self, incoming: int) -> bool:
        """Make room for ``incoming`` bytes; False if pinned/in-use files prevent it."""
        if incoming > self.capacity_bytes:
            return False
        excess = self._used + incoming - self.capacity_bytes
        if excess <= 0:
            return True
        victims = []
        for key in self._policy.candidates():
            entry = self._index[key]
            if entry.pin_count == 0 and entry.readers == 0:
                victims.append(key)
                excess -= entry.file_size
                if excess <= 0:
                    break
        if excess > 0:
            return False
        for key in victims:
            self._drop_locked(key, evicted=True)
        self._evictions += len(victims)
        return True

    def _drop_locked(self, key: CacheEngineKey, evicted: bool = False) -> None:
        # No folder fsync: an unlink lost to a crash brings back a complete object (or one
        # that fails validation and is deleted at the next start), never wrong bytes.
        entry = self._index.pop(key)
        self.salt_usage.remove(key)
        if evicted:
            self._policy.on_evict(key)
        else:
            self._policy.on_remove(key)
        self._used -= entry.file_size
        unlink_quietly(entry.path)

    # -- reads --------------------------------------------------------------------------------

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                return False
            if pin:
                entry.pin_count += 1
            return True

    def batched_contains(self, keys: list[CacheEngineKey], pin: bool = False) -> int:
        hits = 0
        with self._lock:
            for key in keys:
                entry = self._index.get(key)
                if entry is None:
                    break
                if pin:
                    entry.pin_count += 1
                hits += 1
        return hits

    def _wait_for_put_of(self, keys: list[CacheEngineKey]) -> None:
        self._puts.wait_for(keys)  # a failed put left no file: a miss

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        self._wait_for_put_of([key])
        return self._get_indexed(key)

    def _get_indexed(self, key: CacheEngineKey) -> MemoryObj | None:
        """Read ``key`` if its file is indexed; never waits for in-flight puts."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                return None
            entry.readers += 1
            self._policy.on_hit(key)
        corrupt = False
        try:
            obj = self._read(key, entry)
        except (OSError, CorruptFileError, ValueError, KeyError) as exc:
            logger.warning("corrupt cache file %s for %s (%s): removed", entry.path, key, exc)
            obj, corrupt = None, True
        with self._lock:
            entry.readers -= 1
            if corrupt:
                self._errors += 1
                if self._index.get(key) is entry:
                    self._drop_locked(key)
        return obj

    def batched_get_blocking(self, keys: list[CacheEngineKey]) -> list[MemoryObj | None]:
        """Reads on the thread pool: file reads release the GIL, so files load in parallel."""
        # Wait for in-flight puts here, not in the pool: a pooled read waiting for a put
        # queued behind it in the same pool would deadlock.
        self._wait_for_put_of(keys)
        if len(keys) <= 1:
            return [self._get_indexed(key) for key in keys]
        return list(self._executor.map(self._get_indexed, keys))

    def _read(self, key: CacheEngineKey, entry: DiskEntry) -> MemoryObj | None:
        return read_chunk_file(key, entry.path, self._allocate)

    def _allocate(
        self, shapes: list[torch.Size], dtypes: list[torch.dtype], fmt: MemoryFormat
    ) -> MemoryObj | None:
        return allocate_for_read(self.local_cpu_backend, shapes, dtypes, fmt)

    # -- pins and removal ---------------------------------------------------------------------

    def pin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                return False
            entry.pin_count += 1
            return True

    def unpin(self, key: CacheEngineKey) -> bool:
        with self._lock:
            entry = self._index.get(key)
            if entry is None or entry.pin_count == 0:
                return False
            entry.pin_count -= 1
            return True

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        self._wait_for_put_of([key])
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                return False
            if not force and (entry.pin_count or entry.readers):
                return False
            self._drop_locked(key)
            return True

    # -- misc ---------------------------------------------------------------------------------

    def get_allocator_backend(self) -> AllocatorBackendInterface:
        if self.local_cpu_backend is None:
            raise RuntimeError("LocalDiskBackend was built without a LocalCPUBackend")
        return self.local_cpu_backend

    def wait_for_puts(self) -> None:
        """Block until every submitted put has finished (tests, shutdown, benchmarks)."""
        self._puts.wait_for()

    # -- health -------------------------------------------------------------------------------

    def health_problems(self) -> list[str]:
        """Why the tier cannot take writes now (empty when it can): the last writes all
        failed, or there is less free space than one chunk."""
        problems = []
        free = self._free_bytes()
        chunk = self._largest_chunk
        room = free is None or free >= chunk
        if not room:
            problems.append(
                f"{free} bytes free on {self.path}, less than one chunk ({chunk} bytes)"
            )
        with self._lock:
            failed, last = self._failed_in_a_row, self._last_failure
        if failed >= self._unhealthy_after and not (room and self._trial_write_works(chunk)):
            problems.append(f"the last {failed} writes to {self.path} failed ({last})")
        return problems

    def _free_bytes(self) -> int | None:
        try:
            st = os.statvfs(self.path)
        except OSError:
            return None  # a missing folder fails the writes (and the server's own probe)
        return int(st.f_bavail * st.f_frsize)

    def _trial_write_works(self, nbytes: int) -> bool:
        """While writes fail, the health check tries one chunk-sized write itself, so an
        idle tier recovers when the disk does; a success counts as a successful write."""
        try:
            write_trial_file(self.path, nbytes, self._fsync)
        except OSError as exc:
            with self._lock:
                self._last_failure = f"{type(exc).__name__}: {exc}"
            return False
        self._write_succeeded()
        return True

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def failed_writes_in_a_row(self) -> int:
        """Writes that failed since the last one that succeeded."""
        return self._failed_in_a_row

    @property
    def errors(self) -> int:
        """Failed writes and corrupt files found by reads since the tier started."""
        return self._errors

    @property
    def evictions(self) -> int:
        """Files dropped to make room since the tier started (removals are not counted)."""
        return self._evictions

    def __len__(self) -> int:
        return len(self._index)

    def get_keys(self) -> list[CacheEngineKey]:
        with self._lock:
            return list(self._index)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
