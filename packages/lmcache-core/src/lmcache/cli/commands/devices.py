"""``lmcache devices``: the plugin guide's debugging checklist as a command.

Lists every discovered backend (source, device type, availability, priority, whether
native ops are bound, transfer-mode capabilities), every skipped plugin with the reason,
the diagnoses of ``lmcache plugin check`` (without its import timing), why ``DEVICE_TYPE``
was not honoured when it fell back, and which backend this process would select and why.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from lmcache.v1.platform.diagnose import diagnose_registry, explain_device_type_fallback
from lmcache.v1.platform.registry import (
    DEVICE_BACKEND_ENV_VAR,
    DEVICE_TYPE_ENV_VAR,
    RegisteredBackend,
    get_registry,
    select_backend,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "devices",
        help="List discovered device backends, skipped plugins and the selected backend.",
        description=__doc__,
    )
    parser.add_argument("--json", action="store_true", help="Print machine-readable JSON.")
    parser.set_defaults(func=run)


def _safe(call: Any) -> Any:
    try:
        return call()
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"


def _ops_state(backend: RegisteredBackend, available: bool) -> dict[str, Any]:
    if not available:
        return {"ops": "not loaded (backend unavailable)", "native_symbols": []}
    ops = _safe(backend.spec.get_ops)
    if isinstance(ops, str):
        return {"ops": ops, "native_symbols": []}
    native = ops.native_module_name
    return {
        "ops": f"native ({native})" if native else "torch baseline",
        "native_symbols": list(ops.native_symbols),
    }


def _capabilities(backend: RegisteredBackend) -> dict[str, Any]:
    spec = backend.spec
    wrapper = _safe(lambda: spec.ipc_wrapper_cls)
    events = _safe(lambda: spec.event_ipc_backend)
    return {
        "lmcache_driven": _safe(spec.is_lmcache_driven_available),
        "default_mode": _safe(lambda: spec.default_mp_transfer_mode().value),
        "ipc_wrapper": wrapper
        if isinstance(wrapper, str) or wrapper is None
        else f"{wrapper.__module__}.{wrapper.__qualname__}",
        "handle_transfer": _safe(spec.is_handle_transfer_available),
        "event_ipc": events
        if isinstance(events, str) or events is None
        else type(events).__qualname__,
    }


def collect_report() -> dict[str, Any]:
    registry = get_registry()
    backends = []
    for backend in registry.backends.values():
        available = _safe(backend.spec.is_available) is True
        backends.append(
            {
                "backend_name": backend.backend_name,
                "device_type": backend.device_type,
                "source": backend.source.describe(),
                "available": available,
                "priority": _safe(lambda b=backend: b.spec.priority),
                **_ops_state(backend, available),
                "transfer_modes": _capabilities(backend),
            }
        )
    selection = _safe(lambda: select_backend(registry))
    selected = (
        {"error": selection}
        if isinstance(selection, str)
        else {
            "backend_name": selection.backend.backend_name,
            "device_type": selection.device_type,
            "reason": selection.reason,
        }
    )
    return {
        "environment": {
            DEVICE_TYPE_ENV_VAR: os.environ.get(DEVICE_TYPE_ENV_VAR),
            DEVICE_BACKEND_ENV_VAR: os.environ.get(DEVICE_BACKEND_ENV_VAR),
        },
        "backends": backends,
        "skipped": [vars(s) | {} for s in registry.skipped],
        "diagnoses": [d.line() for d in diagnose_registry(registry)],
        "device_type_fallback": explain_device_type_fallback(registry),
        "selected": selected,
    }


def _print_text(report: dict[str, Any]) -> None:
    print("Discovered backends:")
    for b in report["backends"]:
        print(
            f"  {b['backend_name']:<16} device_type={b['device_type']:<8} "
            f"available={b['available']!s:<5} priority={b['priority']}  source={b['source']}"
        )
        print(f"  {'':<16} ops: {b['ops']}")
        caps = b["transfer_modes"]
        print(
            f"  {'':<16} transfer: lmcache_driven={caps['lmcache_driven']} "
            f"default={caps['default_mode']} ipc_wrapper={caps['ipc_wrapper']} "
            f"event_ipc={caps['event_ipc']}"
        )
    print("Skipped plugins:" if report["skipped"] else "Skipped plugins: none")
    for s in report["skipped"]:
        print(f"  {s['name']} ({s['target']}) from {s['source']}: {s['reason']}")
    print("Diagnoses:" if report["diagnoses"] else "Diagnoses: none")
    for line in report["diagnoses"]:
        print(f"  {line}")
    if report["device_type_fallback"]:
        print(f"Fallback: {report['device_type_fallback']}")
    selected = report["selected"]
    if "error" in selected:
        print(f"Selected: none -- {selected['error']}")
    else:
        print(
            f"Selected: {selected['backend_name']} (device_type={selected['device_type']}): "
            f"{selected['reason']}"
        )


def run(args: argparse.Namespace) -> int:
    report = collect_report()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_text(report)
    return 1 if "error" in report["selected"] else 0
