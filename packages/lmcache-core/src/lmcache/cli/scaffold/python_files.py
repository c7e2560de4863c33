"""Templates of the scaffold's Python sources (``string.Template``: ``$name`` etc.)."""

from __future__ import annotations

INIT = '''"""LMCache device plugin ``$name`` (device type ``$device_type``)."""
'''

# The spec of a host-memory backend: the in-tree cpu backend's wrapper, cache context and
# event IPC come with it, so both server transfer modes work out of the box.
DEVICE_CPU = '''"""``${cls}DeviceSpec``: the ``lmcache.device_plugins`` entry-point target.

Imported by every LMCache process while the registry initializes: keep it cheap (no ops,
no native module, no heavy imports here; ``ops_cls`` imports them lazily).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmcache.v1.platform.cpu import CpuDeviceSpec

if TYPE_CHECKING:
    from lmcache.v1.platform.base.device_ops import DeviceOps


class ${cls}DeviceSpec(CpuDeviceSpec):
    """Host memory with this plugin's kernels.

    The highest priority among available backends of a device type is selected (the
    in-tree ``cpu`` has 0, lmcache-cpu's ``cpu_native`` 10).  Below them this backend runs
    only where it is asked for (``LMCACHE_DEVICE_BACKEND=$name``, the conformance suite's
    ``--lmcache-backend $name``); set a priority above theirs only once ``lmcache plugin
    check $name --bench`` shows its kernels beat theirs.
    """

    @property
    def backend_name(self) -> str:
        return "$name"

    @property
    def priority(self) -> int:
        return $priority

    @property
    def ops_cls(self) -> type[DeviceOps]:
        from $pkg.device_ops import ${cls}DeviceOps

        return ${cls}DeviceOps

    def is_available(self) -> bool:
        return True  # host memory is always there
'''

DEVICE_ACCEL = '''"""``${cls}DeviceSpec``: the ``lmcache.device_plugins`` entry-point target.

Imported by every LMCache process while the registry initializes: keep it cheap (no ops,
no native module, no heavy imports here; ``ops_cls`` imports them lazily).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmcache.v1.platform.base.device_spec import DeviceSpec

if TYPE_CHECKING:
    from lmcache.v1.platform.base.device_ops import DeviceOps


class ${cls}DeviceSpec(DeviceSpec):
    @property
    def device_type(self) -> str:
        return "$device_type"

    @property
    def backend_name(self) -> str:
        return "$name"

    @property
    def torch_module_name(self) -> str:
        return "$device_type"

    @property
    def priority(self) -> int:
        # The highest priority among available backends of a device type is selected:
        # raise it above another backend of this type only once your kernels beat its
        # (lmcache plugin check $name --bench).
        return $priority

    @property
    def ops_cls(self) -> type[DeviceOps]:
        from $pkg.device_ops import ${cls}DeviceOps

        return ${cls}DeviceOps

    def is_available(self) -> bool:
        # Never raise here: the registry calls it in every process.
        try:
            import torch

            module = getattr(torch, "$device_type", None)
            return module is not None and bool(module.is_available())
        except Exception:
            return False
'''

DEVICE_OPS = '''"""``${cls}DeviceOps``: binds ``$pkg.native_ops`` fail-soft (else the baseline)."""

from __future__ import annotations

from typing import ClassVar

from lmcache.logging import plugin_logger
from lmcache.v1.platform.kernel_kit.native_loader import NativeDeviceOps, NativeModuleLoader

# Inside the lmcache logger tree (lmcache.plugins.$pkg...): --log-level, LMCACHE_LOG_LEVEL
# and LMCache's log format apply to this plugin's messages too.
logger = plugin_logger(__name__)

load_native_ops = NativeModuleLoader(
    "$pkg.native_ops",
    disable_env_var="$disable_var",
    ops_name="${cls}DeviceOps",
    label="$pkg",
    logger=logger,
)


class ${cls}DeviceOps(NativeDeviceOps):
    device_type: ClassVar[str] = "$device_type"  # must equal the spec's device_type
    native_loader = load_native_ops
'''

NATIVE_OPS = '''"""The module ``bind_native`` overlays: the kernel kit's ops around our kernels.

``kv_ops`` declares every KV op once, with the torch baseline's exact name, signature,
checks and error messages; inputs our kernels decline run the baseline.
"""

from __future__ import annotations

from lmcache.v1.platform.kernel_kit.ops import kv_ops as _kv_ops

from $pkg._kernels import ${cls}Kernels

_KV_OPS = _kv_ops(${cls}Kernels())
globals().update(_KV_OPS)
__all__ = sorted(_KV_OPS)
'''

KERNELS = '''"""``${cls}Kernels``: executes the kernel kit's job records.

The kit hands over addresses and element strides only; each kernel turns a job into a
list of (destination, source) row copies and runs them with ``_copy_many``.  Replace
``_copy_many`` (or the whole methods) with your device's kernels.
"""

from __future__ import annotations

${extra_import}from typing import Any

from lmcache.v1.platform.kernel_kit import checks
from lmcache.v1.platform.kernel_kit.checks import Unsupported
from lmcache.v1.platform.kernel_kit.geometry import EngineGeometry, ObjectGeometry, PlaneGroup
from lmcache.v1.platform.kernel_kit.kernels import BlockCopy, KVKernels, SlotCopy
$copy_many

Moves = tuple[list[int], list[int]]


def _rows(geom: EngineGeometry, group: PlaneGroup, engine: int, obj: int, to_engine: bool,
          moves: Moves) -> None:  # fmt: skip
    es = geom.itemsize
    for head in range(geom.num_heads):
        e = engine + head * group.head_stride * es
        o = obj + head * geom.head_width * es
        src, dst = (o, e) if to_engine else (e, o)
        moves[0].append(dst)
        moves[1].append(src)


def _plane(group: PlaneGroup, i: int, lmc: ObjectGeometry, es: int) -> tuple[int, int]:
    return group.bases[i], lmc.plane_address(group.kv[i], group.layers[i], group.cols[i] * es)


def _indices(selection: Any) -> list[int]:
    if isinstance(selection, slice):
        return list(range(selection.start, selection.stop))
    return [int(v) for v in selection.tolist()]


def _run(geom: EngineGeometry, per_group: dict[int, Moves]) -> None:
    for index, (dst, src) in per_group.items():
        _copy_many(dst, src, geom.groups[index].width * geom.itemsize)


class ${cls}Kernels(KVKernels):
    # These kernels reach host memory only: anything else runs the torch baseline.
    def check_device(self, device: Any) -> None:
        if device.type != "cpu":
            raise Unsupported(f"{device} is not host memory")

    def check_engine_tensor(self, tensor: Any, arg: str) -> None:
        if tensor.device.type != "cpu":
            raise Unsupported(f"{arg} is on {tensor.device}")

    def check_lmcache_tensor(self, tensor: Any, arg: str) -> None:
        self.check_engine_tensor(tensor, arg)

    def copy_blocks(self, job: BlockCopy) -> None:
        geom, es, bs = job.geom, job.geom.itemsize, job.geom.block_size
        moves: dict[int, Moves] = {i: ([], []) for i in range(len(geom.groups))}
        runs = checks.block_runs(job.block_ids, job.blocks_per_object, job.skip, len(job.objects))
        for obj_index, slots, engine_ids in runs:
            obj = job.objects[obj_index]
            assert obj is not None
            for slot, block in zip(_indices(slots), _indices(engine_ids)):
                for g, group in enumerate(geom.groups):
                    for i in range(len(group.bases)):
                        base, plane = _plane(group, i, obj, es)
                        for row in range(bs):
                            offset = block * group.block_stride + row * group.tok_stride
                            engine = base + offset * es
                            lmc = plane + (slot * bs + row) * obj.row_stride
                            _rows(geom, group, engine, lmc, job.to_engine, moves[g])
        _run(geom, moves)

    def copy_slots(self, job: SlotCopy) -> None:
        geom, es = job.geom, job.geom.itemsize
        moves: dict[int, Moves] = {i: ([], []) for i in range(len(geom.groups))}
        positions, valid = checks.selected_tokens(job.slots, job.skip, 0)
        for position, slot in zip(_indices(positions), _indices(valid)):
            block, row = divmod(slot, geom.block_size)
            for g, group in enumerate(geom.groups):
                for i in range(len(group.bases)):
                    base, plane = _plane(group, i, job.lmcache, es)
                    engine = base + (block * group.block_stride + row * group.tok_stride) * es
                    lmc = plane + position * job.lmcache.row_stride
                    _rows(geom, group, engine, lmc, job.to_engine, moves[g])
        _run(geom, moves)
'''

COPY_MANY_PURE = '''

def _copy_many(dst: list[int], src: list[int], nbytes: int) -> None:
    """Pure-Python row copies (host memory); ``--native`` builds a C++ version."""
    for d, s in zip(dst, src):
        ctypes.memmove(d, s, nbytes)
'''

COPY_MANY_NATIVE = """
from $pkg._native import copy_many as _copy_many  # ImportError: baseline"""

TEST_CONFORMANCE = '''"""Certify the installed backend with the conformance suite."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_conformance_suite_passes(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "lmcache.testing.plugin", "-p",
         "no:cacheprovider", "--pyargs", "lmcache.testing", "--lmcache-backend", "$name",
         "-q"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\\b[1-9]\\d* passed", proc.stdout), proc.stdout[-2000:]


def test_plugin_check_is_clean() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", "plugin", "check", "$name"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
'''

TEST_SELECTED = '''"""Where the device is present: asking for this backend selects it, and without a
variable its priority decides against the other available backends of its type."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

_SELECTION_VARS = ("DEVICE_TYPE", "LMCACHE_DEVICE_BACKEND")


def _devices(**env: str) -> dict[str, Any]:
    from $pkg.device import ${cls}DeviceSpec

    if not ${cls}DeviceSpec().is_available():
        pytest.skip("device $device_type is not present on this host")
    clean = {k: v for k, v in os.environ.items() if k not in _SELECTION_VARS}
    proc = subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", "devices", "--json"],
        capture_output=True, text=True, timeout=300, env={**clean, **env},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def test_selected_when_asked_for() -> None:
    report = _devices(LMCACHE_DEVICE_BACKEND="$name")
    assert report["selected"]["backend_name"] == "$name"


def test_priority_decides_without_a_variable() -> None:
    report = _devices()
    mine = next(b for b in report["backends"] if b["backend_name"] == "$name")
    others = [b["priority"] for b in report["backends"] if b["backend_name"] != "$name"
              and b["device_type"] == "$device_type" and b["available"]]  # fmt: skip
    wins = not others or mine["priority"] > max(others)
    assert (report["selected"]["backend_name"] == "$name") == wins, report["selected"]
'''
