"""Diagnoses of installed device plugins: what ``lmcache plugin check`` and
``lmcache devices`` explain, one line per problem.

Discovery is never re-implemented here: the registry's own records (registered backends
with their source, ``DeviceRegistry.skipped`` with the reason) are the input, and this
module adds the checks the registry does not need to make to work (``is_available()``
raising, an ops class of another device type, a transfer mode declared without what it
needs, priority ties, import cost, a plugin distribution that requires upstream's
``lmcache`` distribution instead of lmcache-core, upstream's distribution installed over
or beside this core).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Mapping

from lmcache.distributions import (
    CORE_DISTRIBUTION,
    upstream_conflict,
    upstream_requirement_problem,
)
from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.registry import (
    DEVICE_BACKEND_ENV_VAR,
    DEVICE_TYPE_ENV_VAR,
    DeviceRegistry,
    RegisteredBackend,
)

PROBLEM = "problem"
WARNING = "warning"
# Modules an entry-point import must not pull in: the registry imports every plugin in
# every process (servers, workers, the CLI), so an import of these costs each of them.
HEAVY_MODULES = ("vllm", "sglang", "transformers", "tensorflow", "jax", "triton")
DEFAULT_MAX_IMPORT_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """One finding about one backend (``backend`` is the entry-point or backend name)."""

    backend: str
    severity: str  # PROBLEM fails `lmcache plugin check`; WARNING does not
    message: str

    def line(self) -> str:
        return f"{self.backend}: {self.severity}: {self.message}"


def _call(call: object) -> tuple[object, str | None]:
    try:
        return call(), None  # type: ignore[operator]
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def _defines(spec: DeviceSpec, name: str) -> bool:
    """True when the spec's class overrides ``name`` of the base ``DeviceSpec``."""
    return getattr(type(spec), name, None) is not getattr(DeviceSpec, name, None)


def check_availability(backend: RegisteredBackend) -> list[Diagnosis]:
    value, error = _call(backend.spec.is_available)
    if error is not None:
        return [
            Diagnosis(
                backend.backend_name,
                PROBLEM,
                f"is_available() raised {error}; it must return False instead "
                "(the registry treats it as unavailable)",
            )
        ]
    if not isinstance(value, bool):
        return [
            Diagnosis(
                backend.backend_name,
                WARNING,
                f"is_available() returned {type(value).__name__}, not bool",
            )
        ]
    return []


def check_ops_device_type(backend: RegisteredBackend) -> list[Diagnosis]:
    ops_cls, error = _call(lambda: backend.spec.ops_cls)
    if error is not None:
        return [Diagnosis(backend.backend_name, PROBLEM, f"ops_cls raised {error}")]
    ops_type = getattr(ops_cls, "device_type", None)
    # The base DeviceOps (device_type "") is the pure baseline and serves any device.
    if ops_type and ops_type != backend.device_type:
        name = getattr(ops_cls, "__qualname__", repr(ops_cls))
        return [
            Diagnosis(
                backend.backend_name,
                PROBLEM,
                f"ops class {name}.device_type is {ops_type!r} but the spec's device_type "
                f"is {backend.device_type!r}; set device_type = {backend.device_type!r} "
                "on the ops class",
            )
        ]
    return []


def check_transfer_modes(backend: RegisteredBackend) -> list[Diagnosis]:
    """LMCache-driven mode needs an IPC wrapper, a cache context and an event backend."""
    spec = backend.spec
    declared, error = _call(spec.is_lmcache_driven_available)
    if error is not None:
        return [
            Diagnosis(
                backend.backend_name, PROBLEM, f"is_lmcache_driven_available() raised {error}"
            )
        ]
    if not declared:
        return []
    missing = []
    wrapper, error = _call(lambda: spec.ipc_wrapper_cls)
    if error is not None or wrapper is None or not callable(getattr(wrapper, "wrap", None)):
        missing.append("ipc_wrapper_cls (a DeviceIPCWrapper with a wrap classmethod)")
    if not _defines(spec, "create_cache_context"):
        missing.append("create_cache_context() returning a BaseCacheContext")
    events, error = _call(lambda: spec.event_ipc_backend)
    if error is not None or events is None:
        missing.append("event_ipc_backend")
    handles, error = _call(spec.is_handle_transfer_available)
    if error is not None or handles is not True:
        missing.append("is_handle_transfer_available() returning True")
    if not missing:
        return []
    return [
        Diagnosis(
            backend.backend_name,
            PROBLEM,
            "declares LMCache-driven transfer (is_lmcache_driven_available() is True) but "
            f"lacks {'; '.join(missing)}",
        )
    ]


def declared_priority(backend: RegisteredBackend) -> int | None:
    """The backend's ``priority`` when it is an int (None when reading it fails or it is not)."""
    value, error = _call(lambda: backend.spec.priority)
    return value if error is None and isinstance(value, int) else None


def reports_available(backend: RegisteredBackend) -> bool:
    """Whether ``is_available()`` returns True (False when it raises or returns anything else)."""
    return _call(backend.spec.is_available)[0] is True


def check_priority_ties(registry: DeviceRegistry, backend: RegisteredBackend) -> list[Diagnosis]:
    """Another backend of the same device type with the same priority: auto-selection
    fails with an error when both are available on one host."""
    mine = declared_priority(backend)
    tied = [
        other
        for other in registry.backends.values()
        if other is not backend
        and other.device_type == backend.device_type
        and declared_priority(other) == mine
    ]
    if not tied:
        return []
    available = reports_available(backend)
    both = [o for o in tied if reports_available(o)]
    names = ", ".join(o.backend_name for o in tied)
    advice = (
        f"raise this backend's priority above theirs, or users must set "
        f"{DEVICE_BACKEND_ENV_VAR}={backend.backend_name}"
    )
    if available and both:
        message = (
            f"priority {mine} ties with available backend(s) {names} of device_type "
            f"{backend.device_type!r}: selection fails here; {advice}"
        )
        return [Diagnosis(backend.backend_name, PROBLEM, message)]
    message = (
        f"priority {mine} ties with {names} of device_type {backend.device_type!r}; "
        f"on a host where both are available selection fails; {advice}"
    )
    return [Diagnosis(backend.backend_name, WARNING, message)]


def check_requires_upstream(
    name: str, dist: importlib.metadata.Distribution | None
) -> list[Diagnosis]:
    """A plugin whose metadata requires ``lmcache`` (upstream) instead of lmcache-core."""
    problem = upstream_requirement_problem(dist) if dist is not None else None
    return [Diagnosis(name, PROBLEM, problem)] if problem else []


def _distribution(backend: RegisteredBackend) -> importlib.metadata.Distribution | None:
    if backend.source.distribution is None:
        return None
    try:
        return importlib.metadata.distribution(backend.source.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_upstream_installed() -> list[Diagnosis]:
    """Upstream's ``lmcache`` distribution installed over or beside this core."""
    conflict = upstream_conflict()
    return [Diagnosis(CORE_DISTRIBUTION, PROBLEM, conflict)] if conflict else []


def diagnose_backend(registry: DeviceRegistry, backend: RegisteredBackend) -> list[Diagnosis]:
    return (
        check_availability(backend)
        + check_ops_device_type(backend)
        + check_transfer_modes(backend)
        + check_priority_ties(registry, backend)
        + check_requires_upstream(backend.backend_name, _distribution(backend))
    )


def diagnose_skipped(
    registry: DeviceRegistry, names: Iterable[str] | None = None
) -> list[Diagnosis]:
    """The registry's own skip records, as problems (import failure, not a class, raising
    constructor, invalid or mismatched name, duplicate)."""
    wanted = None if names is None else set(names)
    return [
        Diagnosis(s.name, PROBLEM, f"skipped by the registry ({s.target}, {s.source}): {s.reason}")
        for s in registry.skipped
        if wanted is None or s.name in wanted
    ]


def diagnose_registry(
    registry: DeviceRegistry, names: Iterable[str] | None = None, entry_points_only: bool = False
) -> list[Diagnosis]:
    """Every diagnosis for the named backends (default: all, and the installation's own)."""
    wanted = None if names is None else set(names)
    found = check_upstream_installed() if wanted is None else []
    found.extend(diagnose_skipped(registry, wanted))
    for backend in registry.backends.values():
        if wanted is not None and backend.backend_name not in wanted:
            continue
        if entry_points_only and backend.source.kind != "entry-point":
            continue
        found.extend(diagnose_backend(registry, backend))
    return found


# -- import cost, measured in a fresh interpreter --------------------------------------
_IMPORT_PROBE = textwrap.dedent(
    """
    import importlib, json, sys, time
    import lmcache.v1.platform.base.device_spec  # every plugin imports it anyway
    before = set(sys.modules)
    start = time.perf_counter()
    importlib.import_module(sys.argv[1])
    seconds = time.perf_counter() - start
    cuda = False
    if "torch" in sys.modules:
        try:
            cuda = bool(sys.modules["torch"].cuda.is_initialized())
        except Exception:
            pass
    new = sorted(set(sys.modules) - before)
    print(json.dumps({"seconds": seconds, "new": new, "cuda_initialized": cuda}))
    """
)


def measure_import(module: str, timeout: float = 120.0) -> dict[str, object]:
    """Import ``module`` alone in a fresh interpreter: seconds, new modules, CUDA state."""
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, module],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": tail}
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def check_import_cost(
    name: str, module: str, max_seconds: float = DEFAULT_MAX_IMPORT_SECONDS
) -> list[Diagnosis]:
    measured = measure_import(module)
    if "error" in measured:
        return [Diagnosis(name, PROBLEM, f"importing {module} failed: {measured['error']}")]
    found = []
    seconds = float(measured["seconds"])  # type: ignore[arg-type]
    if seconds > max_seconds:
        found.append(
            Diagnosis(
                name,
                PROBLEM,
                f"importing {module} took {seconds:.2f} s (limit {max_seconds:.2f} s); keep "
                "ops, native libraries and wrappers behind lazy properties",
            )
        )
    new = measured.get("new", [])
    roots = {str(m).split(".")[0] for m in new} if isinstance(new, list) else set()
    heavy = sorted(roots & set(HEAVY_MODULES))
    if heavy:
        found.append(Diagnosis(name, PROBLEM, f"importing {module} imports {', '.join(heavy)}"))
    if measured.get("cuda_initialized"):
        found.append(
            Diagnosis(name, PROBLEM, f"importing {module} initializes CUDA (torch.cuda.init)")
        )
    return found


# -- selection explanation -----------------------------------------------------------
def explain_device_type_fallback(
    registry: DeviceRegistry, env: Mapping[str, str] | None = None
) -> str | None:
    """Why ``DEVICE_TYPE`` was not honoured (None when it is unset or usable)."""
    env = os.environ if env is None else env
    wanted = env.get(DEVICE_TYPE_ENV_VAR, "").strip().lower()
    if not wanted or env.get(DEVICE_BACKEND_ENV_VAR, "").strip():
        return None
    group = registry.by_device_type().get(wanted, [])
    if not group:
        types = ", ".join(sorted(registry.by_device_type())) or "(none)"
        skipped = [s.name for s in registry.skipped]
        hint = f"; skipped plugins: {', '.join(skipped)}" if skipped else ""
        return (
            f"{DEVICE_TYPE_ENV_VAR}={wanted}: no registered backend has that device_type "
            f"(registered: {types}){hint}; auto-detection ran instead"
        )
    reasons = []
    for backend in group:
        value, error = _call(backend.spec.is_available)
        if error is not None:
            reasons.append(f"{backend.backend_name}: is_available() raised {error}")
        elif value is not True:
            reasons.append(f"{backend.backend_name}: is_available() is False")
        elif not _torch_has(backend.spec.torch_module_name):
            reasons.append(
                f"{backend.backend_name}: torch has no module {backend.spec.torch_module_name!r}"
            )
    if len(reasons) < len(group):
        return None
    return (
        f"{DEVICE_TYPE_ENV_VAR}={wanted}: no backend of that type is usable "
        f"({'; '.join(reasons)}); auto-detection ran instead"
    )


def _torch_has(name: str) -> bool:
    try:
        import torch
    except Exception:
        return False
    return bool(name) and getattr(torch, name, None) is not None
