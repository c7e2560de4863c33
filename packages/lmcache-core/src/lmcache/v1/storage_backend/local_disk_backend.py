"""L2: one file per chunk on a local file system, bounded by bytes, crash-safe.

A put writes ``<name>.<random>.tmp`` on a thread pool, fsyncs it, renames it to
``<name>.lmc`` and fsyncs the folder, so a crash leaves either the old state or the complete
file.  The index (key -> file) lives in memory and is rebuilt from the folder when the
backend starts.

The tier owns its folder and touches nothing else in it:

* A marker file, :data:`MARKER_NAME` (JSON with the folder layout version), is written on
  first use.  A marker with a newer layout version is refused.
* Only names the tier writes are its own: objects ``<32 hex digits>.lmc``, unfinished
  writes ``<32 hex digits>.lmc.<8 hex digits>.tmp`` (and the marker's own temporary file).
  Unfinished writes are deleted at start-up, objects that fail validation are deleted;
  every other entry is *foreign* and is never read, renamed or deleted.
* A folder holding foreign entries is refused at start-up (:class:`DiskFolderError` names
  the folder and the first few entries) unless the tier is told to adopt it
  (``extra_config["local_disk.adopt"]``, ``lmcache server --l2-disk-adopt`` or
  ``"adopt": true`` in a disk ``--l2-adapter``); adopted, it leaves them untouched and
  does not count them against its size.  ``lost+found`` (a file system's root) is ignored.
* Migration: a folder without a marker whose entries all carry the tier's names was
  written by an earlier version (which wrote no marker): it is adopted automatically and
  the marker is added.

File format (little-endian), version 2 (written)::

    magic  b"LMCD" | version u16 (=2) | checksum u16 | header_len u32 | payload_len u64
    payload_sum u64 | header_sum u64 | header (UTF-8 JSON) | payload

``checksum`` names the algorithm of both sums: 1 = CRC-32 (zero-extended), 2 = XXH3-64.
New objects use XXH3-64 (``xxhash``, tens of GB/s per core, so verifying a read costs a
fraction of reading it); CRC-32 only when ``xxhash`` is not importable.  Version 1 (still
read) is the same without the algorithm: ``flags u16`` (0) in its place and
``payload_crc32 u32 | header_crc32 u32``.

The JSON header holds the key string, shapes, dtypes, memory format and used size.
A file whose header, length or payload checksum does not match -- or whose checksum
algorithm this process cannot compute -- is logged, deleted and reported as a miss; a
reader never sees its bytes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, NamedTuple

import torch

from lmcache.utils import CacheEngineKey, dtype_to_str, parse_cache_key, str_to_dtype
from lmcache.v1.config import LMCacheEngineConfig, LMCacheMetadata
from lmcache.v1.memory_management import (
    MemoryFormat,
    MemoryObj,
    MemoryObjMetadata,
    TensorMemoryObj,
    part_offsets,
)
from lmcache.v1.storage_backend.abstract_backend import (
    AllocatorBackendInterface,
    StorageBackendInterface,
)
from lmcache.v1.storage_backend.cache_policy import get_cache_policy
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

logger = logging.getLogger(__name__)

MAGIC = b"LMCD"
FORMAT_VERSION = 2
"""The version written; :func:`read_header` also reads :data:`FORMAT_VERSION_CRC32`."""
FORMAT_VERSION_CRC32 = 1
_LEAD = struct.Struct("<4sHH")  # magic, version, checksum algorithm (v1: flags)
_REST_V1 = struct.Struct("<IQII")
_REST_V2 = struct.Struct("<IQQQ")
PREFIX_SIZE = _LEAD.size + _REST_V2.size
"""Bytes before the JSON header in the written format."""
_PREFIX_SIZES = {
    FORMAT_VERSION_CRC32: _LEAD.size + _REST_V1.size,
    FORMAT_VERSION: PREFIX_SIZE,
}
FILE_SUFFIX = ".lmc"
TMP_SUFFIX = ".tmp"
MARKER_NAME = ".lmcache-disk-tier"
"""The file that says "this folder belongs to an lmcache disk tier"."""
FOLDER_LAYOUT_VERSION = 1
"""Version of the folder layout (marker and file names), recorded in the marker."""
_OBJECT_NAME = re.compile(r"[0-9a-f]{32}" + re.escape(FILE_SUFFIX))
_TMP_NAME = re.compile(
    r"(?:[0-9a-f]{32}" + re.escape(FILE_SUFFIX) + "|" + re.escape(MARKER_NAME) + r")"
    r"\.[0-9a-f]{8}" + re.escape(TMP_SUFFIX)
)
_IGNORED_DIRS = frozenset({"lost+found"})
_FOREIGN_SHOWN = 5
_MAX_HEADER = 1 << 20

CHECKSUM_CRC32 = 1
CHECKSUM_XXH3_64 = 2
CHECKSUM_NAMES = {CHECKSUM_CRC32: "CRC-32", CHECKSUM_XXH3_64: "XXH3-64"}


class CorruptFileError(Exception):
    """A cache file failed validation."""


class DiskFolderError(ValueError):
    """The disk tier's folder is not one it may use (foreign entries, a newer layout)."""


class _InvalidMarkerError(DiskFolderError):
    """The marker cannot be parsed (adopting the folder rewrites it)."""


def _crc32(data: Any) -> int:
    return zlib.crc32(data)


def _load_xxh3() -> Callable[[Any], int] | None:
    try:
        from xxhash import xxh3_64_intdigest
    except ImportError:
        logger.debug("xxhash is not installed: new cache objects are checksummed with CRC-32")
        return None
    return xxh3_64_intdigest


_CHECKSUM_FUNCS: dict[int, Callable[[Any], int]] = {CHECKSUM_CRC32: _crc32}
_xxh3 = _load_xxh3()
if _xxh3 is not None:
    _CHECKSUM_FUNCS[CHECKSUM_XXH3_64] = _xxh3
WRITE_CHECKSUM = CHECKSUM_XXH3_64 if _xxh3 is not None else CHECKSUM_CRC32
"""The algorithm of new objects: XXH3-64, or CRC-32 where ``xxhash`` is missing."""


def checksum(algorithm: int, data: Any) -> int:
    """``algorithm``'s digest of ``data`` (any buffer); CorruptFileError if unavailable."""
    func = _CHECKSUM_FUNCS.get(algorithm)
    if func is None:
        name = CHECKSUM_NAMES.get(algorithm, f"#{algorithm}")
        raise CorruptFileError(f"checksum algorithm {name} is not available here")
    return func(data)


class PayloadChecksum(NamedTuple):
    """The payload's recorded sum and its algorithm, from :func:`read_header`."""

    algorithm: int
    expected: int

    def verify(self, payload: Any) -> None:
        if checksum(self.algorithm, payload) != self.expected:
            raise CorruptFileError("payload checksum mismatch")


def encode_prefix(header: bytes, payload: Any, algorithm: int | None = None) -> bytes:
    """The prefix of an object (current format version) with sums of ``header``/``payload``."""
    algo = WRITE_CHECKSUM if algorithm is None else algorithm
    rest = _REST_V2.pack(len(header), len(payload), checksum(algo, payload), checksum(algo, header))
    return _LEAD.pack(MAGIC, FORMAT_VERSION, algo) + rest


@dataclass(slots=True)
class _Entry:
    path: str
    file_size: int
    header: dict[str, Any]
    pin_count: int = 0
    readers: int = 0


def file_name_for(key: CacheEngineKey) -> str:
    """File name of ``key``: a digest, since key strings may contain '/'."""
    return hashlib.blake2b(key.to_bytes(), digest_size=16).hexdigest() + FILE_SUFFIX


def encode_header(key: CacheEngineKey, obj: MemoryObj) -> dict[str, Any]:
    meta = obj.metadata
    return {
        "key": key.to_string(),
        "shapes": [list(s) for s in obj.get_shapes()],
        "dtypes": [dtype_to_str(d) for d in obj.get_dtypes()],
        "fmt": obj.get_memory_format().value,
        "used_size": meta.used_size,
    }


def _payload_view(obj: MemoryObj) -> memoryview:
    return obj.byte_array


def read_header(f: BinaryIO, file_size: int) -> tuple[dict[str, Any], int, PayloadChecksum]:
    """``(header, payload_len, payload_checksum)`` of a version 1 or 2 object; raises
    :class:`CorruptFileError`."""
    lead = f.read(_LEAD.size)
    if len(lead) != _LEAD.size:
        raise CorruptFileError("truncated prefix")
    magic, version, algorithm = _LEAD.unpack(lead)
    if magic != MAGIC:
        raise CorruptFileError("bad magic")
    if version == FORMAT_VERSION:
        rest_struct = _REST_V2
    elif version == FORMAT_VERSION_CRC32:
        rest_struct, algorithm = _REST_V1, CHECKSUM_CRC32  # v1: the field is flags
    else:
        raise CorruptFileError(f"unsupported format version {version}")
    rest = f.read(rest_struct.size)
    if len(rest) != rest_struct.size:
        raise CorruptFileError("truncated prefix")
    header_len, payload_len, payload_sum, header_sum = rest_struct.unpack(rest)
    if header_len > _MAX_HEADER:
        raise CorruptFileError("header too large")
    expected_size = _PREFIX_SIZES[version] + header_len + payload_len
    if file_size != expected_size:
        raise CorruptFileError(f"size {file_size} != expected {expected_size}")
    raw_header = f.read(header_len)
    if len(raw_header) != header_len or checksum(algorithm, raw_header) != header_sum:
        raise CorruptFileError("header checksum mismatch")
    try:
        header = json.loads(raw_header)
    except ValueError as exc:
        raise CorruptFileError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or "key" not in header:
        raise CorruptFileError("header without key")
    return header, payload_len, PayloadChecksum(algorithm, payload_sum)


class _Kind:
    """What a folder entry is to the tier (see :func:`classify_entry`)."""

    OBJECT = "object"
    TMP = "tmp"
    MARKER = "marker"
    IGNORED = "ignored"
    FOREIGN = "foreign"


def classify_entry(entry: os.DirEntry[str]) -> str:
    """One of the :class:`_Kind` values; only plain files can be the tier's own."""
    name = entry.name
    if entry.is_dir(follow_symlinks=False) and name in _IGNORED_DIRS:
        return _Kind.IGNORED
    if not entry.is_file(follow_symlinks=False):
        return _Kind.FOREIGN
    if name == MARKER_NAME:
        return _Kind.MARKER
    if _OBJECT_NAME.fullmatch(name):
        return _Kind.OBJECT
    if _TMP_NAME.fullmatch(name):
        return _Kind.TMP
    return _Kind.FOREIGN


def fsync_directory(path: str) -> None:
    """Make renames and unlinks in ``path`` durable (a file's fsync does not cover them)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _foreign_message(path: str, foreign: list[str]) -> str:
    shown = ", ".join(sorted(foreign)[:_FOREIGN_SHOWN])
    more = f" and {len(foreign) - _FOREIGN_SHOWN} more" if len(foreign) > _FOREIGN_SHOWN else ""
    return (
        f"disk tier folder {path} holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'}"
        f" it did not write ({shown}{more}); refusing to use it. Point the tier at an empty "
        f"folder (or its own), or adopt this one (extra_config local_disk.adopt: true, "
        f'--l2-disk-adopt, or "adopt": true in a disk --l2-adapter): foreign entries are '
        f"then left untouched"
    )


def _read_marker(path: str) -> dict[str, Any] | None:
    """The marker's content; None if absent; DiskFolderError if unreadable."""
    marker = os.path.join(path, MARKER_NAME)
    try:
        with open(marker, "rb") as f:
            raw = f.read(4096)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DiskFolderError(f"disk tier marker {marker} cannot be read: {exc}") from exc
    try:
        content = json.loads(raw)
        version = content["layout_version"]
    except (ValueError, TypeError, KeyError):
        raise _InvalidMarkerError(
            f"disk tier marker {marker} is not valid; adopt the folder to rewrite it"
        ) from None
    if not isinstance(version, int) or version > FOLDER_LAYOUT_VERSION:
        raise DiskFolderError(
            f"disk tier folder {path} has layout version {version!r} (marker {marker}); "
            f"this lmcache reads up to {FOLDER_LAYOUT_VERSION}: use a newer lmcache or "
            f"another folder"
        )
    return dict(content)


def _write_marker(path: str) -> None:
    """Atomically: a crash leaves no marker or the whole marker, never half of one."""
    content = {
        "owner": "lmcache disk tier",
        "layout_version": FOLDER_LAYOUT_VERSION,
        "object_format_version": FORMAT_VERSION,
    }
    final = os.path.join(path, MARKER_NAME)
    tmp = f"{final}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"
    with open(tmp, "wb") as f:
        f.write(json.dumps(content).encode("utf-8") + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fsync_directory(path)


class FolderState(NamedTuple):
    """What :func:`inspect_disk_folder` found."""

    marked: bool
    """A valid marker is present."""
    foreign: int
    """Entries the tier did not write (only non-zero when adopting)."""
    earlier_version: bool
    """No marker, but objects of the tier: written by a version without markers."""


def inspect_disk_folder(path: str, adopt: bool = False) -> FolderState:
    """Check that the disk tier may use ``path`` without changing anything in it; raises
    :class:`DiskFolderError` (foreign entries unless ``adopt``, a newer layout, a bad
    marker unless ``adopt``, not a folder).  A missing folder is fine (it will be made).

    The server calls this before it allocates memory, so a refused folder costs nothing."""
    if not os.path.lexists(path):
        return FolderState(marked=False, foreign=0, earlier_version=False)
    if not os.path.isdir(path):
        raise DiskFolderError(f"disk tier path {path} exists and is not a folder")
    marker_ok = True
    try:
        marker = _read_marker(path)
    except _InvalidMarkerError:
        if not adopt:
            raise
        marker, marker_ok = None, False
    with os.scandir(path) as entries:
        kinds = [(entry.name, classify_entry(entry)) for entry in entries]
    foreign = [name for name, kind in kinds if kind == _Kind.FOREIGN]
    if foreign and not adopt:
        raise DiskFolderError(_foreign_message(path, foreign))
    has_objects = any(kind == _Kind.OBJECT for _, kind in kinds)
    return FolderState(
        marked=marker is not None,
        foreign=len(foreign),
        earlier_version=marker is None and marker_ok and has_objects,
    )


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
        _write_marker(self.path)

    def _rebuild_index(self) -> None:
        found: list[tuple[float, CacheEngineKey, _Entry]] = []
        removed = 0
        with os.scandir(self.path) as entries:
            for dirent in entries:
                kind = classify_entry(dirent)
                if kind == _Kind.TMP:
                    logger.info("removing unfinished write %s", dirent.path)
                    self._unlink(dirent.path)
                    removed += 1
                elif kind == _Kind.OBJECT:
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

    def __len__(self) -> int:
        return len(self._index)

    def get_keys(self) -> list[CacheEngineKey]:
        with self._lock:
            return list(self._index)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def allocate_for_read(
    local_cpu_backend: AllocatorBackendInterface | None,
    shapes: list[torch.Size],
    dtypes: list[torch.dtype],
    fmt: MemoryFormat,
) -> MemoryObj | None:
    """Memory for a chunk read back from a lower tier: from L1's allocator when there is
    one (None when it is full), else a standalone object."""
    if local_cpu_backend is not None:
        if len(shapes) == 1:
            return local_cpu_backend.allocate(shapes[0], dtypes[0], fmt)
        return local_cpu_backend.allocate(shapes, dtypes, fmt)
    nbytes = part_offsets(shapes, dtypes)[-1]
    multi = len(shapes) > 1
    meta = MemoryObjMetadata(
        shape=shapes[0],
        dtype=dtypes[0],
        address=0,
        phy_size=nbytes,
        ref_count=1,
        fmt=fmt,
        shapes=shapes if multi else None,
        dtypes=dtypes if multi else None,
    )
    return TensorMemoryObj(torch.empty(nbytes, dtype=torch.uint8), meta)


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
