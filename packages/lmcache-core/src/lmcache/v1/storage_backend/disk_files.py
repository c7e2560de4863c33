"""One chunk file of the disk tier: the crash-safe write, the verified read, the index entry.

A write goes to ``<name>.<random>.tmp``, is fsynced, renamed to ``<name>.lmc`` and the
folder fsynced, so a crash leaves either the old state or the complete file.  A read checks
the header, the key, the length and the payload checksum before the caller sees any byte.
The byte format is :mod:`lmcache.v1.storage_backend.chunk_format`; the folder's names are
:mod:`lmcache.v1.storage_backend.disk_folder`.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import torch

from lmcache.utils import CacheEngineKey, parse_cache_key, str_to_dtype
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.storage_backend.chunk_format import (
    CorruptFileError,
    encode_prefix,
    read_header,
)
from lmcache.v1.storage_backend.disk_folder import (
    FILE_SUFFIX,
    TMP_SUFFIX,
    EntryKind,
    classify_entry,
    file_name_for,
    fsync_directory,
)

logger = logging.getLogger(__name__)

Allocate = Callable[[list[torch.Size], list[torch.dtype], MemoryFormat], MemoryObj | None]


@dataclass(slots=True)
class DiskEntry:
    """An indexed chunk file: its size counts against the tier; pinned or read ones stay."""

    path: str
    file_size: int
    header: dict[str, Any]
    pin_count: int = 0
    readers: int = 0


def write_chunk_file(
    folder: str, key: CacheEngineKey, obj: MemoryObj, header: bytes, fsync: bool
) -> str:
    """Write ``obj`` as ``key``'s file in ``folder``; returns its path.  On failure the
    temporary file is removed and the error raised (no partial ``.lmc`` ever exists)."""
    final = os.path.join(folder, file_name_for(key))
    tmp = f"{final}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"
    try:
        payload = obj.byte_array
        prefix = encode_prefix(header, payload)
        with open(tmp, "wb", buffering=0) as f:
            _write_all(f, prefix + header)
            _write_all(f, payload)
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, final)
        if fsync:
            fsync_directory(folder)
    except BaseException:
        unlink_quietly(tmp)
        raise
    return final


def write_trial_file(folder: str, nbytes: int, fsync: bool) -> None:
    """Write ``nbytes`` of zeros to a temporary file in ``folder`` and remove it: whether a
    chunk of that size can be written now.  Raises the write's ``OSError``.  The name is
    an unfinished write's, so a crash in between leaves a file the next start removes."""
    tmp = os.path.join(
        folder, f"{uuid.uuid4().hex}{FILE_SUFFIX}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"
    )
    block = bytes(min(max(nbytes, 1), 1 << 20))
    try:
        with open(tmp, "wb", buffering=0) as f:
            left = max(nbytes, 1)
            while left > 0:
                _write_all(f, memoryview(block)[: min(left, len(block))])
                left -= len(block)
            if fsync:
                os.fsync(f.fileno())
    finally:
        unlink_quietly(tmp)


def read_chunk_file(key: CacheEngineKey, path: str, allocate: Allocate) -> MemoryObj | None:
    """``key``'s object read from ``path`` into memory from ``allocate`` (None: no memory).

    Raises :class:`CorruptFileError` (or ``OSError``/``ValueError``/``KeyError``) when the
    file does not hold ``key`` intact; the allocated object is released first."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        header, payload_len, payload_sum = read_header(f, size)
        if header["key"] != key.to_string():
            raise CorruptFileError("key in header does not match")
        shapes = [torch.Size(s) for s in header["shapes"]]
        dtypes = [str_to_dtype(d) for d in header["dtypes"]]
        obj = allocate(shapes, dtypes, MemoryFormat(header["fmt"]))
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


def scan_folder(folder: str, fsync: bool) -> list[tuple[CacheEngineKey, DiskEntry]]:
    """The objects of ``folder``, oldest first; unfinished writes and corrupt objects are
    removed (foreign entries are never touched)."""
    found: list[tuple[float, CacheEngineKey, DiskEntry]] = []
    removed = 0
    with os.scandir(folder) as entries:
        for dirent in entries:
            kind = classify_entry(dirent)
            if kind == EntryKind.TMP:
                logger.info("removing unfinished write %s", dirent.path)
                unlink_quietly(dirent.path)
                removed += 1
            elif kind == EntryKind.OBJECT:
                loaded = load_entry(dirent.path)
                if loaded is None:
                    removed += 1
                else:
                    found.append((dirent.stat(follow_symlinks=False).st_mtime, *loaded))
    if removed and fsync:
        fsync_directory(folder)
    found.sort(key=lambda item: item[0])
    return [(key, entry) for _, key, entry in found]


def load_entry(path: str) -> tuple[CacheEngineKey, DiskEntry] | None:
    """The index entry of an object file found at start-up; a corrupt one is removed."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header, _, _ = read_header(f, size)
        key = parse_cache_key(header["key"])
        if os.path.basename(path) != file_name_for(key):
            raise CorruptFileError("file name does not match its key")
    except (OSError, CorruptFileError, ValueError, KeyError) as exc:
        logger.warning("corrupt cache file %s (%s): removed", path, exc)
        unlink_quietly(path)
        return None
    return key, DiskEntry(path, size, header)


def unlink_quietly(path: str) -> None:
    """Remove ``path``; already gone is fine, other errors are only logged."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("cannot remove %s: %s", path, exc)


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
