"""Speed as part of ``lmcache plugin check``: the hot op against what it would replace.

A backend's ``multi_layer_block_kv_transfer`` (both directions, the NHD layer-list layout
vLLM uses) runs next to the torch baseline on the same device, through
:func:`lmcache.bench.ops.compare_block_transfer`.  ``--bench`` prints the rates and ratios
for every checked backend.  Without it, a backend is measured only when it would be
selected over another available backend of its device type (it outranks it): running at
less than ``SLOWER_RATIO`` of that backend, in a first measurement and again in a second,
is a warning, since installing the plugin then makes the server slower.  The ops take
turns call by call, each one's best call counts, and torch runs on one thread: on a loaded
host its thread pool waits for descheduled threads, and two equal ops measured with it
differed by 0.4-3.5x, with one thread by 0.97-1.01x (the plugin's own threads, if any,
are its own).  The wide margin and the second look cover what noise is left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from lmcache.bench.ops import bench_arguments, compare_block_transfer, torch_threads
from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.diagnose import (
    WARNING,
    Diagnosis,
    declared_priority,
    reports_available,
)
from lmcache.v1.platform.registry import DeviceRegistry, RegisteredBackend

BASELINE = "torch baseline"
OP = "multi_layer_block_kv_transfer"
FAMILY = "nhd_layer_list"
# 8 layers x 2 chunks of 256 tokens x 8 heads x 128 (fp16): 16 MiB a call, a few seconds.
BENCH_ARGV = ("--layers", "8", "--chunks", "2", "--warmup", "1", "--repeats", "10")
# Below this fraction of the displaced backend's rate, twice: a warning.
SLOWER_RATIO = 0.5


@dataclasses.dataclass(frozen=True)
class SpeedReport:
    backend: str
    device: str
    rates: dict[str, dict[str, float]]  # direction -> label -> GB/s
    replaced: str | None  # the label of what the backend displaces, if it does

    def lines(self) -> list[str]:
        header = (
            f"speed: {OP} ({FAMILY}, device {self.device}, torch on 1 thread), GB/s, "
            "best of repeats:"
        )
        rows = []
        for direction, rates in self.rates.items():
            ratio = rates[self.backend] / rates[BASELINE]
            others = "  ".join(f"{label} {gbps:.2f}" for label, gbps in rates.items()
                               if label not in (self.backend, BASELINE))  # fmt: skip
            rows.append(
                f"  {direction}  {self.backend} {rates[self.backend]:.2f}  {BASELINE} "
                f"{rates[BASELINE]:.2f}  ratio {ratio:.2f}x" + (f"  ({others})" if others else "")
            )
        return [header, *rows]


def displaced_backend(
    registry: DeviceRegistry, backend: RegisteredBackend
) -> RegisteredBackend | None:
    """The backend auto-selection picks for this device type without ``backend``, when
    ``backend`` outranks it (None: nothing is displaced)."""
    mine = declared_priority(backend)
    if mine is None or not reports_available(backend):
        return None
    others = [
        (priority, other)
        for other in registry.by_device_type().get(backend.device_type, [])
        if other is not backend and reports_available(other)
        and (priority := declared_priority(other)) is not None
    ]  # fmt: skip
    if not others:
        return None
    top, best = max(others, key=lambda pair: pair[0])
    return best if mine > top else None


def _device(backend: RegisteredBackend) -> str:
    # A backend over host memory (torch module "cpu") keeps its tensors on the host.
    return "cpu" if backend.spec.torch_module_name == "cpu" else backend.device_type


def _op(backend: RegisteredBackend) -> tuple[Callable[..., None], bool]:
    """The backend's op, and whether it is native (else it is the torch baseline's)."""
    ops = backend.spec.get_ops()
    return getattr(ops, OP), bool(getattr(ops, "native_module_name", None))


def measure(backend: RegisteredBackend, replaced: RegisteredBackend | None) -> SpeedReport:
    """Rates of the backend, the torch baseline and (if native) the displaced backend."""
    op, _ = _op(backend)
    ops: dict[str, Callable[..., None]] = {
        backend.backend_name: op,
        BASELINE: torch_ops.multi_layer_block_kv_transfer,
    }
    replaced_label = None
    if replaced is not None:
        replaced_op, native = _op(replaced)
        replaced_label = replaced.backend_name if native else BASELINE
        if native:
            ops[replaced.backend_name] = replaced_op
    with torch_threads(1):
        rates = compare_block_transfer(ops, bench_arguments(*BENCH_ARGV), FAMILY, _device(backend))
    return SpeedReport(backend.backend_name, _device(backend), rates, replaced_label)


def _slow_directions(report: SpeedReport) -> dict[str, float]:
    """Direction -> ratio to the displaced backend, where below SLOWER_RATIO."""
    assert report.replaced is not None
    ratios = {d: r[report.backend] / r[report.replaced] for d, r in report.rates.items()}
    return {d: ratio for d, ratio in ratios.items() if ratio < SLOWER_RATIO}


def slower_than_replaced(
    report: SpeedReport, backend: RegisteredBackend, replaced: RegisteredBackend
) -> list[Diagnosis]:
    """A warning when the backend runs below SLOWER_RATIO of what it displaces, in this
    measurement and in a second one (a loaded host's noise rarely repeats)."""
    slow = _slow_directions(report)
    if not slow:
        return []
    again = _slow_directions(measure(backend, replaced))
    slow = {d: min(ratio, again[d]) for d, ratio in slow.items() if d in again}
    if not slow:
        return []
    what = (
        f"{replaced.backend_name}'s ops"
        if report.replaced != BASELINE
        else f"{replaced.backend_name} (the torch baseline)"
    )
    shown = ", ".join(f"{ratio:.2f}x ({d})" for d, ratio in slow.items())
    return [
        Diagnosis(
            backend.backend_name,
            WARNING,
            f"selected over {replaced.backend_name} (priority {declared_priority(backend)} > "
            f"{declared_priority(replaced)}) but its {OP} runs at {shown} of {what}: installing it "
            f"makes the server slower; keep its priority below {declared_priority(replaced)} "
            f"(lmcache plugin new's default) until its kernels are faster",
        )
    ]


def check_speed(
    registry: DeviceRegistry, backend: RegisteredBackend, always: bool
) -> tuple[list[Diagnosis], SpeedReport | None]:
    """Measure when asked (``always``) or when the backend displaces another one."""
    replaced = displaced_backend(registry, backend)
    if not reports_available(backend) or (replaced is None and not always):
        return [], None
    report = measure(backend, replaced)
    found = slower_than_replaced(report, backend, replaced) if replaced is not None else []
    return found, report
