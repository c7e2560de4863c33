"""Ownership of the disk tier's folder: the marker, the names the tier writes, the check.

The tier owns its folder and touches nothing else in it:

* A marker file, :data:`MARKER_NAME` (JSON with the folder layout version), is written on
  first use.  A marker with a newer layout version is refused.
* Only names the tier writes are its own: objects ``<32 hex digits>.lmc``, unfinished
  writes ``<32 hex digits>.lmc.<8 hex digits>.tmp`` (and the marker's own temporary file).
  Every other entry is *foreign* and is never read, renamed or deleted.
* A folder holding foreign entries is refused (:class:`DiskFolderError` names the folder
  and the first few entries) unless the tier is told to adopt it; adopted, the foreign
  entries are left untouched.  ``lost+found`` (a file system's root) is ignored.
* A folder without a marker whose entries all carry the tier's names was written by an
  earlier version (which wrote no marker): :func:`inspect_disk_folder` says so and the tier
  adopts it and adds the marker.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from typing import Any, NamedTuple

from lmcache.utils import CacheEngineKey
from lmcache.v1.storage_backend.chunk_format import FORMAT_VERSION

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


class DiskFolderError(ValueError):
    """The disk tier's folder is not one it may use (foreign entries, a newer layout)."""


class _InvalidMarkerError(DiskFolderError):
    """The marker cannot be parsed (adopting the folder rewrites it)."""


def file_name_for(key: CacheEngineKey) -> str:
    """File name of ``key``: a digest, since key strings may contain '/'."""
    return hashlib.blake2b(key.to_bytes(), digest_size=16).hexdigest() + FILE_SUFFIX


class EntryKind:
    """What a folder entry is to the tier (see :func:`classify_entry`)."""

    OBJECT = "object"
    TMP = "tmp"
    MARKER = "marker"
    IGNORED = "ignored"
    FOREIGN = "foreign"


def classify_entry(entry: os.DirEntry[str]) -> str:
    """One of the :class:`EntryKind` values; only plain files can be the tier's own."""
    name = entry.name
    if entry.is_dir(follow_symlinks=False) and name in _IGNORED_DIRS:
        return EntryKind.IGNORED
    if not entry.is_file(follow_symlinks=False):
        return EntryKind.FOREIGN
    if name == MARKER_NAME:
        return EntryKind.MARKER
    if _OBJECT_NAME.fullmatch(name):
        return EntryKind.OBJECT
    if _TMP_NAME.fullmatch(name):
        return EntryKind.TMP
    return EntryKind.FOREIGN


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


def write_marker(path: str) -> None:
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
    foreign = [name for name, kind in kinds if kind == EntryKind.FOREIGN]
    if foreign and not adopt:
        raise DiskFolderError(_foreign_message(path, foreign))
    has_objects = any(kind == EntryKind.OBJECT for _, kind in kinds)
    return FolderState(
        marked=marker is not None,
        foreign=len(foreign),
        earlier_version=marker is None and marker_ok and has_objects,
    )
