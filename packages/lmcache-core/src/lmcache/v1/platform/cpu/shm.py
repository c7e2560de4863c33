"""``CpuShmTensorWrapper``: a host KV-cache tensor shared with the cache server via POSIX SHM.

LMCache-driven mode on CPU: the worker's KV cache lives in a POSIX shared-memory segment
(``/dev/shm/lmcache_kv_*``); the wrapper names the segment and the tensor's place in it,
and the server maps the same pages (zero-copy: both processes see one copy of the bytes).

This module is also the one home of shared-memory segment mechanics for the core:
``SHM_DIR``, creating a segment with its space reserved up front (``create_segment``), the
creator recorded in segment names and the reclaiming of segments whose creator exited
(``reclaim_orphaned_segments``).

Which segment a tensor lives in is read from ``/proc/self/maps`` rather than from a
process-global table, so any tensor whose storage maps such a segment can be wrapped,
however it was created.  Linux only.

``migrate_to_shm_and_wrap`` moves an ordinary CPU tensor there: the unit it moves is the
tensor's whole backing storage, so every view of one buffer lands in one segment at its
own offset, and the segment's name is unlinked once the last tensor using it is freed.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from lmcache.v1.platform.base.ipc_wire import CpuShmIPCData
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper, register_ipc_wrapper

logger = logging.getLogger(__name__)

# Where POSIX shared-memory segments live on Linux; every module of the core imports it.
SHM_DIR = "/dev/shm"
_DELETED_SUFFIX = " (deleted)"


def _segment_path(shm_name: str) -> str:
    name = shm_name.lstrip("/")
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"invalid shared-memory segment name {shm_name!r}")
    return os.path.join(SHM_DIR, name)


def _find_mapping(ptr: int) -> tuple[str, int, int] | None:
    """(segment name, byte offset of ``ptr`` in the segment, segment size) or None."""
    prefix = CpuShmTensorWrapper.SHM_NAME_PREFIX.lstrip("/")
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) < 6:
                    continue
                start_s, end_s = fields[0].split("-")
                start, end = int(start_s, 16), int(end_s, 16)
                if not start <= ptr < end:
                    continue
                path = fields[5].strip()
                if path.endswith(_DELETED_SUFFIX):
                    return None
                directory, name = os.path.split(path)
                if directory != SHM_DIR or not name.startswith(prefix):
                    return None
                offset = ptr - start + int(fields[2], 16)
                return "/" + name, offset, os.stat(path).st_size
    except OSError:
        return None
    return None


def _not_shared_error(tensor: torch.Tensor) -> ValueError:
    return ValueError(
        f"KV-cache tensor (shape {tuple(tensor.shape)}, device {tensor.device}) is not in "
        "POSIX shared memory, so the cache server cannot map it for the lmcache_driven "
        "transfer mode. Allocate the KV cache with "
        "lmcache.v1.platform.cpu.shm.empty_shm_tensor(shape, dtype), or move it with "
        "lmcache.v1.platform.cpu.shm.migrate_to_shm_and_wrap(tensor) before registering, "
        "or use the engine_driven transfer mode (LMCACHE_MP_TRANSFER_MODE=engine_driven)."
    )


# The names that record their creator, so whoever finds the segment can tell whether that
# process is gone (pid alone is not enough: pids are reused, and a process in another pid
# namespace has another pid).  Worker KV segments:
# ``lmcache_kv_<pid>-<start time>-<pid namespace>_<random>``; the server's L1 segment:
# ``lmcache_mp_<pid>_<start time>-<pid namespace>_<random>`` (``lmcache_mp_<pid>_*`` still
# finds a given server's segment).
KV_SEGMENT_PREFIX = "lmcache_kv_"
L1_SEGMENT_PREFIX = "lmcache_mp_"
_CREATOR_NAMES = (
    re.compile(r"^/?lmcache_kv_(\d{1,10})-(\d{1,20})-(\d{1,20})_[0-9a-f]{16}$"),
    re.compile(r"^/?lmcache_mp_(\d{1,10})_(\d{1,20})-(\d{1,20})_[0-9a-f]{12}$"),
)


@dataclass(frozen=True)
class SegmentCreator:
    """The process that created a segment: pid, start time (clock ticks after boot, field
    22 of ``/proc/<pid>/stat``) and pid-namespace inode."""

    pid: int
    start_ticks: int
    pid_namespace: int


def _process_stat(pid: int | str) -> tuple[str, int]:
    """(state, start time in clock ticks) of a process; OSError if it cannot be read."""
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    # The command name (field 2) is in parentheses and may hold spaces or parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _own_pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def current_creator() -> SegmentCreator:
    """This process, as recorded in the names it gives new segments (0 where unknown)."""
    try:
        start = _process_stat("self")[1]
    except (OSError, ValueError, IndexError):
        start = 0
    return SegmentCreator(os.getpid(), start, _own_pid_namespace())


def new_segment_name() -> str:
    """A fresh worker KV segment name (``/lmcache_kv_...``) recording this process."""
    creator = current_creator()
    return (
        f"{CpuShmTensorWrapper.SHM_NAME_PREFIX}{creator.pid}-{creator.start_ticks}-"
        f"{creator.pid_namespace}_{uuid.uuid4().hex[:16]}"
    )


def new_l1_segment_name() -> str:
    """A fresh name for the cache server's L1 segment (``lmcache_mp_...``) recording this
    process, so a later server can reclaim it once this one is gone."""
    creator = current_creator()
    return (
        f"{L1_SEGMENT_PREFIX}{creator.pid}_{creator.start_ticks}-{creator.pid_namespace}_"
        f"{uuid.uuid4().hex[:12]}"
    )


def segment_creator(shm_name: str) -> SegmentCreator | None:
    """The creator recorded in a segment's name, or None (older or foreign name)."""
    for pattern in _CREATOR_NAMES:
        match = pattern.match(shm_name)
        if match is not None:
            pid, start, namespace = (int(group) for group in match.groups())
            return SegmentCreator(pid, start, namespace)
    return None


def creator_is_gone(shm_name: str) -> bool:
    """True only when the segment's creator provably no longer runs.

    Unknown creators (names of an older format, or not made by ``new_segment_name``), a
    creator in another pid namespace, one whose start time was not recorded, and a live
    process we may not inspect all count as alive: the caller must then leave the segment.
    """
    creator = segment_creator(shm_name)
    if creator is None or creator.start_ticks == 0 or creator.pid <= 0:
        return False
    if creator.pid_namespace == 0 or creator.pid_namespace != _own_pid_namespace():
        return False
    try:
        os.kill(creator.pid, 0)
        ours = True
    except ProcessLookupError:
        return True
    except PermissionError:
        ours = False  # alive, another user's; /proc may still tell a reused pid apart
    try:
        state, start = _process_stat(creator.pid)
    except FileNotFoundError:
        # Our own process that vanished meanwhile has exited; another user's may only be
        # hidden from us (``hidepid``), so it counts as alive.
        return ours
    except (OSError, ValueError, IndexError):
        return False
    # A zombie has dropped its mappings; a different start time means the pid was reused.
    return state in ("Z", "X") or start != creator.start_ticks


def unlink_orphaned_segment(shm_name: str) -> bool:
    """Unlink a segment whose creator is provably gone; leave any other to its owner.

    The server calls this for the segments of a worker it reaps. Whoever registered a
    segment need not be its creator (any peer can name any ``lmcache_kv_`` segment), so
    the registration alone never entitles the server to remove the name.
    """
    if not creator_is_gone(shm_name):
        logger.info(
            "left shared-memory segment %s to its owner: its creator is not provably gone",
            shm_name,
        )
        return False
    return unlink_segment(shm_name)


@dataclass(frozen=True)
class ReclaimedSegment:
    """A segment :func:`reclaim_orphaned_segments` unlinked: its name, size and the pid of
    the process that created it and has exited."""

    name: str
    nbytes: int
    dead_pid: int


def reclaim_orphaned_segments(directory: str = SHM_DIR) -> list[ReclaimedSegment]:
    """Unlink every ``lmcache_mp_*`` and ``lmcache_kv_*`` segment whose creator provably
    exited (see :func:`creator_is_gone`), logging each; the rest are left alone.

    A server killed by SIGKILL, SIGBUS or the OOM killer cannot remove its own L1 segment,
    so the next server start does it; without this a crash loop fills ``/dev/shm``.
    """
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        logger.warning("cannot list %s to reclaim orphaned segments: %s", directory, exc)
        return []
    reclaimed = []
    for name in names:
        if not name.startswith((KV_SEGMENT_PREFIX, L1_SEGMENT_PREFIX)):
            continue
        creator = segment_creator(name)
        if creator is None or not creator_is_gone(name):
            continue
        found = _unlink_in(directory, name, creator.pid)
        if found is not None:
            reclaimed.append(found)
    return reclaimed


def _unlink_in(directory: str, name: str, dead_pid: int) -> ReclaimedSegment | None:
    path = os.path.join(directory, name)
    try:
        nbytes = os.stat(path).st_blocks * 512  # what it holds, not its sparse size
        os.unlink(path)
    except FileNotFoundError:
        return None  # another starting server reclaimed it first
    except OSError as exc:
        logger.warning("cannot reclaim orphaned shared-memory segment %s: %s", path, exc)
        return None
    logger.warning(
        "reclaimed orphaned shared-memory segment %s (%d bytes): its creator, pid %d, exited",
        path,
        nbytes,
        dead_pid,
    )
    return ReclaimedSegment(name, nbytes, dead_pid)


# How long a reservation waits for another process's to finish before going ahead alone.
RESERVE_LOCK_WAIT_S = 30.0


def reserve_segment_space(fd: int, nbytes: int, shm_name: str) -> None:
    """Size the segment open at ``fd`` to ``nbytes`` with every byte reserved now.

    A sparse ``ftruncate`` promises pages tmpfs may not have: touching one later, once
    ``/dev/shm`` filled up in the meantime, kills the process with SIGBUS.  Reserving the
    whole size up front turns a full ``/dev/shm`` into an ordinary ``OSError`` here.
    """
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:  # not Linux: the sparse size is all there is
        os.ftruncate(fd, nbytes)
        return
    _reserve_range(fd, 0, nbytes, shm_name)


def reserve_segment_range(shm_name: str, offset: int, nbytes: int) -> None:
    """Reserve ``[offset, offset + nbytes)`` of an existing segment (a lazy L1 growing);
    a full ``/dev/shm`` is an ``OSError`` naming the segment."""
    fd = os.open(_segment_path(shm_name), os.O_RDWR)
    try:
        _reserve_range(fd, offset, nbytes, shm_name)
    finally:
        os.close(fd)


def _reserve_range(fd: int, offset: int, nbytes: int, shm_name: str) -> None:
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:
        return
    lock = _take_reservation_turn()
    try:
        fallocate(fd, offset, nbytes)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise
        refusal = OSError(
            f"cannot reserve {_gib(nbytes)} of shared memory for {shm_name.lstrip('/')} in "
            f"{SHM_DIR} ({_free_space()} free): {exc.strerror}"
        )
        refusal.errno = exc.errno  # kept for callers; the message is the one line shown
        raise refusal from None
    finally:
        if lock is not None:
            os.close(lock)  # releases the turn


def _take_reservation_turn() -> int | None:
    """An exclusive ``flock`` on ``SHM_DIR`` itself (the descriptor to close), or None.

    Two processes reserving at once on a nearly full tmpfs can each get part of their size
    and then both fail, where one would have fitted; taking turns gives the first all of
    it.  Locking the directory leaves no lock file behind, and a process that dies holding
    the turn gives it up.  Where the lock is unavailable, or held longer than
    ``RESERVE_LOCK_WAIT_S`` (a stopped process), the reservation goes ahead alone: it is
    still all-or-nothing, only no longer first-come first-served.
    """
    try:
        fd = os.open(SHM_DIR, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    deadline = time.monotonic() + RESERVE_LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.01)
                continue
            logger.warning(
                "another process has been reserving shared memory in %s for %.0f s; "
                "reserving without waiting for it",
                SHM_DIR,
                RESERVE_LOCK_WAIT_S,
            )
        except OSError:
            pass
        os.close(fd)
        return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 1024**3:.2f} GiB"


def _free_space() -> str:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return "unknown"
    return _gib(st.f_bavail * st.f_frsize)


def create_segment(
    nbytes: int, shm_name: str | None = None, reserve: int | None = None
) -> tuple[str, torch.Tensor]:
    """A new zero-filled segment mapped as a flat uint8 tensor (MAP_SHARED).

    The one place that creates POSIX shm segments (the L1 allocator's buffer comes here
    through :mod:`lmcache.v1.memory.shm`).  Its space is reserved before it is mapped
    (:func:`reserve_segment_space`), so no later touch of its pages can SIGBUS; a segment
    that cannot be reserved or mapped is unlinked before the error propagates, so a failed
    creation leaves no name behind.  With ``reserve`` below ``nbytes`` only the first
    ``reserve`` bytes are reserved now (a lazy L1): the owner must reserve the rest with
    :func:`reserve_segment_range` before it touches or hands out any of it.
    """
    name = shm_name or new_segment_name()
    path = _segment_path(name)
    size = max(1, int(nbytes))
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        try:
            if reserve is not None and reserve < size:
                os.ftruncate(fd, size)  # the full size, sparse: mapped whole at once
                _reserve_range(fd, 0, max(1, int(reserve)), name)
            else:
                reserve_segment_space(fd, size, name)
        finally:
            os.close(fd)
        return name, torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    except BaseException:
        os.unlink(path)
        raise


def map_segment(shm_name: str, nbytes: int) -> torch.Tensor:
    """Map an existing segment; its size must be at least ``nbytes``."""
    path = _segment_path(shm_name)
    actual = os.stat(path).st_size
    if actual < nbytes:
        raise ValueError(f"shared-memory segment {shm_name!r} holds {actual} bytes < {nbytes}")
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


def unlink_segment(shm_name: str) -> bool:
    """Remove the segment's name; pages live on until every mapping is gone."""
    try:
        os.unlink(_segment_path(shm_name))
        return True
    except (FileNotFoundError, ValueError):
        return False


def empty_shm_tensor(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled contiguous CPU tensor whose storage is a fresh ``lmcache_kv_`` segment."""
    numel = 1
    for dim in shape:
        numel *= int(dim)
    itemsize = torch.empty((), dtype=dtype).element_size()
    _name, raw = create_segment(numel * itemsize)
    return raw[: numel * itemsize].view(dtype).view(tuple(shape))


def shm_segment_of(tensor: torch.Tensor) -> str | None:
    """The ``lmcache_kv_`` segment ``tensor`` lives in, or None."""
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return None
    found = _find_mapping(tensor.data_ptr())
    return found[0] if found else None


def _check_view_fits(tensor: torch.Tensor, byte_offset: int, nbytes: int, shm_name: str) -> None:
    """Refuse a view whose last element lies past the end of its segment."""
    if tensor.numel() == 0:
        return
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    end = byte_offset + (last + 1) * tensor.element_size()
    if end > nbytes:
        raise ValueError(
            f"tensor view ends at byte {end}, past the end of the {nbytes}-byte shared-memory "
            f"segment {shm_name!r}"
        )


@register_ipc_wrapper("cpu_shm")
class CpuShmTensorWrapper(DeviceIPCWrapper):
    """A CPU tensor in an ``lmcache_kv_`` POSIX shared-memory segment.

    An empty tensor has no bytes to share: it is described without a segment (``shm_name``
    ``""``, ``nbytes`` 0) and rebuilt locally by :meth:`to_tensor`.
    """

    device_type: ClassVar[str] = "cpu"
    SHM_NAME_PREFIX: ClassVar[str] = "/lmcache_kv_"

    def __init__(
        self, tensor: torch.Tensor, shm_name: str, segment_nbytes: int | None = None
    ) -> None:
        element = tensor.element_size()
        found = _find_mapping(tensor.data_ptr()) if tensor.numel() else None
        # Outside a mapping the caller names the segment that backs the tensor's storage
        # (upstream's model), so the view starts at its storage offset there.
        byte_offset = found[1] if found else int(tensor.storage_offset()) * element
        if byte_offset % element:
            raise ValueError("tensor is not element-aligned inside its shared-memory segment")
        nbytes = segment_nbytes if segment_nbytes is not None else (found[2] if found else 0)
        if found or segment_nbytes is not None:
            _check_view_fits(tensor, byte_offset, int(nbytes), shm_name)
        super().__init__(
            handle=shm_name,
            dtype=tensor.dtype,
            shape=tuple(tensor.shape),
            stride=tuple(tensor.stride()),
            storage_offset=byte_offset // element,
            device_uuid="cpu",
        )
        self.shm_name = shm_name
        self.segment_nbytes = int(nbytes)

    @property
    def nbytes(self) -> int:
        """The segment's size in bytes (upstream's name for ``segment_nbytes``)."""
        return self.segment_nbytes

    @classmethod
    def wrap(cls, tensor: torch.Tensor) -> CpuShmTensorWrapper:
        if tensor.device.type != "cpu":
            raise ValueError(f"CpuShmTensorWrapper wraps CPU tensors, got {tensor.device}")
        if tensor.numel() == 0:
            return cls(tensor, "", 0)
        found = _find_mapping(tensor.data_ptr())
        if found is None:
            raise _not_shared_error(tensor)
        return cls(tensor, found[0], found[2])

    def _is_empty(self) -> bool:
        return any(size == 0 for size in self.shape)

    def to_tensor(self) -> torch.Tensor:
        """Map the segment and view the tensor in it; shares pages with the worker.

        Each call makes its own mapping, owned by the returned tensor's storage: it is
        unmapped once that tensor and every view of it are freed, not by the wrapper.
        """
        if not self.shm_name:
            if not self._is_empty():
                raise ValueError(
                    f"a tensor of shape {self.shape} needs a shared-memory segment, none named"
                )
            return torch.empty_strided(self.shape, self.stride, dtype=self.dtype)
        element = torch.empty((), dtype=self.dtype).element_size()
        if self._is_empty():
            span = self.storage_offset
        else:
            last = sum((s - 1) * st for s, st in zip(self.shape, self.stride))
            span = self.storage_offset + last + 1
        if span * element > self.segment_nbytes or self.storage_offset < 0:
            raise ValueError(f"tensor metadata reaches past the end of segment {self.shm_name!r}")
        raw = map_segment(self.shm_name, self.segment_nbytes)
        # A segment shared by views of other dtypes need not end on this dtype's boundary.
        typed = raw[: self.segment_nbytes - self.segment_nbytes % element].view(self.dtype)
        return typed.as_strided(self.shape, self.stride, self.storage_offset)

    def close(self) -> None:
        """Nothing to release: mappings belong to the tensors :meth:`to_tensor` returned."""

    def to_wire(self) -> CpuShmIPCData:
        return CpuShmIPCData(
            metadata=self.wire_metadata(), shm_name=self.shm_name, nbytes=self.segment_nbytes
        )

    @classmethod
    def from_wire(cls, data: Any) -> CpuShmTensorWrapper:
        if not isinstance(data, CpuShmIPCData):
            raise ValueError(f"expected CpuShmIPCData, got {type(data).__name__}")
        # Only an empty tensor travels without a segment (checked once the shape is known).
        if data.shm_name:
            if not data.shm_name.lstrip("/").startswith(cls.SHM_NAME_PREFIX.lstrip("/")):
                raise ValueError(
                    f"segment {data.shm_name!r} is not an lmcache KV segment "
                    f"(name must start with {cls.SHM_NAME_PREFIX!r})"
                )
            _segment_path(data.shm_name)
        wrapper = cls.__new__(cls)
        DeviceIPCWrapper.__init__(
            wrapper, data.shm_name, torch.uint8, (), (), 0, data.metadata.device_uuid
        )
        wrapper.restore_metadata(data.metadata)
        if len(wrapper.shape) != len(wrapper.stride):
            raise ValueError("tensor metadata has mismatched shape and stride lengths")
        if not data.shm_name and (not wrapper._is_empty() or data.nbytes != 0):
            raise ValueError("only an empty tensor may be described without a segment")
        wrapper.shm_name = data.shm_name
        wrapper.segment_nbytes = int(data.nbytes)
        return wrapper


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _normalized_layout(tensor: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``tensor``'s shape and stride with its dims put in memory order, as upstream does.

    Dims are sorted by decreasing stride; a size-1 dim that ties with a neighbour goes
    innermost, so a torch-contiguous view whose size-1 dims hide the true inner extent
    (shape ``(8, 1, 1, 32)``, stride ``(32, 1, 1, 1)``) becomes ``(8, 32, 1, 1)``.  Where
    the reordered view is not contiguous (padded or overlapping layouts) nothing is
    reordered: the caller's layout is kept as it is (upstream refuses such tensors).
    """
    order = sorted(
        range(tensor.dim()),
        key=lambda d: (tensor.stride(d), tensor.size(d) != 1),
        reverse=True,
    )
    reordered = tensor.permute(order)
    if not reordered.is_contiguous():
        return tuple(tensor.shape), tuple(tensor.stride())
    shape = tuple(reordered.shape)
    return shape, _contiguous_strides(shape)


# The attribute on an original storage naming (weakly) the segment storage it was copied
# into.  Torch keeps one Python object per storage while the storage lives, so the mark
# is found from any view of the buffer and dies with it: no process-wide table.
_MIGRATED_TO = "_lmcache_shm_migrated_to"
# Serialises migrations, so two sibling views migrated at once share one segment.
_migration_lock = threading.Lock()


def _segment_freed(shm_name: str) -> None:
    """The last tensor in a migrated segment is gone: nobody here can use it any more."""
    if unlink_segment(shm_name):
        logger.debug("unlinked shared-memory segment %s: its last tensor was freed", shm_name)


def _migrated_storage(origin: torch.UntypedStorage) -> torch.UntypedStorage | None:
    target_ref: weakref.ReferenceType[torch.UntypedStorage] | None = getattr(
        origin, _MIGRATED_TO, None
    )
    return None if target_ref is None else target_ref()  # None once the segment was freed


def _migrate_storage(origin: torch.UntypedStorage) -> torch.UntypedStorage:
    """Copy all of ``origin`` into a new segment and remember where it went."""
    nbytes = origin.nbytes()
    shm_name, raw = create_segment(nbytes)
    try:
        source = torch.empty(0, dtype=torch.uint8)
        source.set_(origin)
        raw[:nbytes].copy_(source)
    except BaseException:
        unlink_segment(shm_name)
        raise
    target = raw.untyped_storage()
    # The storage object outlives ``raw``: torch keeps it while any tensor uses the pages.
    weakref.finalize(target, _segment_freed, shm_name)
    setattr(origin, _MIGRATED_TO, weakref.ref(target))
    logger.debug("moved a %d-byte CPU storage into shared memory %s", nbytes, shm_name)
    return target


def migrate_to_shm_and_wrap(tensor: torch.Tensor) -> CpuShmTensorWrapper:
    """Re-point ``tensor`` (in place) at a shared-memory copy of its storage, then wrap it.

    The whole backing storage is copied, once: ``tensor`` keeps its storage offset, and
    each later view of the same buffer handed in here is re-pointed at the same segment,
    so the migrated views still alias one another.  Only tensors handed in move; views
    that are not keep the old memory, so migrate before writing to the buffer.  The
    tensor's dims are put in memory order when that makes it contiguous (see
    :func:`_normalized_layout`).  A tensor already in an ``lmcache_kv_`` segment is wrapped
    as it is, and an empty one is wrapped without a segment.  A segment made here is
    unlinked once the last tensor in it is freed.
    """
    if tensor.device.type != "cpu":
        raise ValueError(f"only CPU tensors can move to shared memory, got {tensor.device}")
    if tensor.numel() == 0 or shm_segment_of(tensor) is not None:
        return CpuShmTensorWrapper.wrap(tensor)
    shape, stride = _normalized_layout(tensor)
    origin = tensor.untyped_storage()
    with _migration_lock:
        target = _migrated_storage(origin)
        if target is None:
            target = _migrate_storage(origin)
        with torch.no_grad():
            tensor.set_(target, tensor.storage_offset(), shape, stride)
    return CpuShmTensorWrapper.wrap(tensor)
