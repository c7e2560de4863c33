"""L2: one file per chunk on a local file system, bounded by bytes, crash-safe.

A put writes ``<name>.<random>.tmp`` on a thread pool, fsyncs it, renames it to
``<name>.lmc`` and fsyncs the folder, so a crash leaves either the old state or the complete
file.  The index (key -> file) lives in memory and is rebuilt from the folder when the
backend starts: unfinished writes are deleted, objects that fail validation are deleted.

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
than the tier's size) are counted in :attr:`LocalDiskBackend.evictions`.

This module also re-exports the names of the chunk format and folder modules it was split
from, so ``lmcache.v1.storage_backend.local_disk_backend`` keeps every name it had.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO

import torch

from lmcache.utils import CacheEngineKey, parse_cache_key, str_to_dtype
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


@dataclass(slots=True)
class _Entry:
    path: str
    file_size: int
    header: dict[str, Any]
    pin_count: int = 0
    readers: int = 0


def _payload_view(obj: MemoryObj) -> memoryview:
    return obj.byte_array


class LocalDiskBackend(StorageBackendInterface):
    """Disk tier.  Reads allocate from ``local_cpu_backend`` (the L1 allocator)."""

    def __init__(
        self,
        config: LMCacheEngineConfig | None = None,
        local_cpu_backend: LocalCPUBackend | None = None,
        metadata: LMCacheMetadata | None = None,
        dst_device: str = "cpu",
        path: str | None = None,
        max_bytes: int | None = None,
        adopt: bool | None = None,
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
        self._index: dict[CacheEngineKey, _Entry] = {}
        self._policy = get_cache_policy(self.config.cache_policy)
        self._put_tasks: dict[CacheEngineKey, Future] = {}
        self._used = 0
        self._evictions = 0
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
        found: list[tuple[float, CacheEngineKey, _Entry]] = []
        removed = 0
        with os.scandir(self.path) as entries:
            for dirent in entries:
                kind = classify_entry(dirent)
                if kind == EntryKind.TMP:
                    logger.info("removing unfinished write %s", dirent.path)
                    self._unlink(dirent.path)
                    removed += 1
                elif kind == EntryKind.OBJECT:
                    loaded = self._load_entry(dirent.path)
                    if loaded is None:
                        removed += 1
                    else:
                        found.append((dirent.stat(follow_symlinks=False).st_mtime, *loaded))
        if removed and self._fsync:
            fsync_directory(self.path)
        found.sort(key=lambda item: item[0])
        with self._lock:
            for _, key, entry in found:
                self._index[key] = entry
                self._policy.on_put(key)
                self._used += entry.file_size
            self._evict_locked(0)
        if found:
            logger.info(
                "disk tier %s: %d objects (%d bytes) indexed", self.path, len(found), self._used
            )

    def _load_entry(self, path: str) -> tuple[CacheEngineKey, _Entry] | None:
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                header, _, _ = read_header(f, size)
            key = parse_cache_key(header["key"])
            if os.path.basename(path) != file_name_for(key):
                raise CorruptFileError("file name does not match its key")
        except (OSError, CorruptFileError, ValueError, KeyError) as exc:
            logger.warning("corrupt cache file %s (%s): removed", path, exc)
            self._unlink(path)
            return None
        return key, _Entry(path, size, header)

    # -- writes -------------------------------------------------------------------------------

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        with self._lock:
            return key in self._put_tasks

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
                if key in self._index or key in self._put_tasks:
                    continue
                if not self._evict_locked(file_size):
                    logger.debug("disk tier full (pinned or in use): put of %s skipped", key)
                    continue
                self._used += file_size
                obj.ref_count_up()
                future = self._executor.submit(
                    self._write, key, obj, header, file_size, on_complete_callback
                )
                self._put_tasks[key] = future
            futures.append(future)
        return futures

    def _write(
        self,
        key: CacheEngineKey,
        obj: MemoryObj,
        header: bytes,
        file_size: int,
        on_complete_callback: Callable[[CacheEngineKey], None] | None,
    ) -> None:
        final = os.path.join(self.path, file_name_for(key))
        tmp = f"{final}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"
        try:
            payload = _payload_view(obj)
            prefix = encode_prefix(header, payload)
            with open(tmp, "wb", buffering=0) as f:
                _write_all(f, prefix + header)
                _write_all(f, payload)
                if self._fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, final)
            if self._fsync:
                fsync_directory(self.path)
        except BaseException:
            logger.exception("disk write of %s failed", key)
            self._unlink(tmp)
            with self._lock:
                self._used -= file_size
                self._put_tasks.pop(key, None)
            obj.ref_count_down()
            raise
        with self._lock:
            self._index[key] = _Entry(final, file_size, json.loads(header))
            self._policy.on_put(key)
            self._put_tasks.pop(key, None)
        obj.ref_count_down()
        if on_complete_callback is not None:
            on_complete_callback(key)

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
            self._drop_locked(key)
        self._evictions += len(victims)
        return True

    def _drop_locked(self, key: CacheEngineKey) -> None:
        # No folder fsync: an unlink lost to a crash brings back a complete object (or one
        # that fails validation and is deleted at the next start), never wrong bytes.
        entry = self._index.pop(key)
        self._policy.on_remove(key)
        self._used -= entry.file_size
        self._unlink(entry.path)

    @staticmethod
    def _unlink(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("cannot remove %s: %s", path, exc)

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
        with self._lock:
            pending = [self._put_tasks[k] for k in keys if k in self._put_tasks]
        for future in pending:
            try:
                future.result()
            except BaseException:
                pass  # the failed put left no file: a miss

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
            if corrupt and self._index.get(key) is entry:
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

    def _read(self, key: CacheEngineKey, entry: _Entry) -> MemoryObj | None:
        with open(entry.path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            header, payload_len, payload_sum = read_header(f, size)
            if header["key"] != key.to_string():
                raise CorruptFileError("key in header does not match")
            shapes = [torch.Size(s) for s in header["shapes"]]
            dtypes = [str_to_dtype(d) for d in header["dtypes"]]
            fmt = MemoryFormat(header["fmt"])
            obj = self._allocate(shapes, dtypes, fmt)
            if obj is None:
                logger.warning("no memory to read %s from disk", key)
                return None
            try:
                if header.get("used_size") is not None:
                    obj.set_used_size(int(header["used_size"]))
                if obj.get_size() != payload_len:
                    raise CorruptFileError("payload length does not match the header")
                view = obj.byte_array
                _read_exact(f, view)
                payload_sum.verify(view)
            except BaseException:
                obj.ref_count_down()
                raise
        return obj

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
        with self._lock:
            keys = list(self._put_tasks)
        self._wait_for_put_of(keys)

    @property
    def used_bytes(self) -> int:
        return self._used

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


def _write_all(f: BinaryIO, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = f.write(view)
        if not written:
            raise OSError("short write")
        view = view[written:]


def _read_exact(f: BinaryIO, dst: memoryview) -> None:
    view = dst.cast("B") if dst.format != "B" else dst
    while view:
        n = f.readinto(view)  # type: ignore[attr-defined]
        if not n:
            raise CorruptFileError("truncated payload")
        view = view[n:]
