"""``lmcache plugin``: the vendor kit for device plugins.

``lmcache plugin check [NAME]`` validates the installed ``lmcache.device_plugins`` entry
points (all, or the one named) and prints one line per problem: the registry's own reasons
for skipping a plugin (import failure, not a class, raising constructor, entry-point name
!= lowercase ``backend_name``, duplicate), ``is_available()`` raising, an ops class of
another device type, a transfer mode declared without what it needs, priority ties with
other installed backends, and an entry-point import that is slow or pulls in heavy
modules.  Exit status 1 when any problem is found.

``lmcache plugin new NAME`` writes a complete external plugin repository (see
``lmcache plugin new --help``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path
from typing import Any

from lmcache.v1.platform.diagnose import (
    DEFAULT_MAX_IMPORT_SECONDS,
    PROBLEM,
    Diagnosis,
    check_import_cost,
    diagnose_backend,
    diagnose_skipped,
)
from lmcache.v1.platform.registry import (
    DEVICE_PLUGIN_ENTRY_POINT_GROUP,
    DeviceRegistry,
    build_registry,
)

CHECK_DESCRIPTION = (
    "Validate the installed lmcache.device_plugins entry points (all, or the one named): "
    "one line per problem or warning, exit status 1 on any problem."
)
NEW_DESCRIPTION = (
    "Write a complete device-plugin repository for backend NAME: pyproject.toml with the "
    "entry point, the DeviceSpec, DeviceOps over the kernel kit, the conformance tests, a "
    "noxfile and a CI workflow.  It builds, installs and passes its own tests outside this "
    "checkout (nox -s tests with LMCACHE_WHEELHOUSE set)."
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plugin", help="Check installed device plugins or scaffold a new one.", description=__doc__
    )
    actions = parser.add_subparsers(dest="plugin_command", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        help="Validate installed lmcache.device_plugins entry points.",
        description=CHECK_DESCRIPTION,
    )
    check.add_argument("name", nargs="?", help="entry-point / backend name (default: all)")
    check.add_argument(
        "--max-import-seconds",
        type=float,
        default=DEFAULT_MAX_IMPORT_SECONDS,
        help="an entry-point import slower than this is a problem (default %(default)s)",
    )
    check.set_defaults(func=run_check)
    new = actions.add_parser(
        "new", help="Scaffold an external device-plugin repository.", description=NEW_DESCRIPTION
    )
    new.add_argument("name", help="backend name (lowercase letters, digits, _)")
    new.add_argument("--device-type", default=None, help="torch device type (default: NAME)")
    new.add_argument(
        "--native", action="store_true", help="add a nanobind + scikit-build-core native module"
    )
    new.add_argument("--output", type=Path, default=None, help="folder (default ./lmcache-NAME)")
    new.set_defaults(func=run_new)


def _entry_points(name: str | None) -> list[importlib.metadata.EntryPoint]:
    eps = importlib.metadata.entry_points(group=DEVICE_PLUGIN_ENTRY_POINT_GROUP)
    return sorted((ep for ep in eps if name is None or ep.name == name), key=lambda e: e.name)


def _label(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "unknown dist"
    return f"{ep.name} = {ep.value} ({where})"


def check_entry_point(
    registry: DeviceRegistry, ep: importlib.metadata.EntryPoint, max_import_seconds: float
) -> list[Diagnosis]:
    found = diagnose_skipped(registry, [ep.name])
    backend = registry.backends.get(ep.name)
    if backend is not None and backend.source.entry_point == f"{ep.name} = {ep.value}":
        found.extend(diagnose_backend(registry, backend))
    if not any("import failed" in d.message for d in found):
        found.extend(check_import_cost(ep.name, ep.value.split(":", 1)[0], max_import_seconds))
    return found


def run_check(args: argparse.Namespace) -> int:
    registry = build_registry()
    eps = _entry_points(args.name)
    if args.name is not None and not eps:
        backend = registry.backends.get(args.name)
        if backend is None:
            raise RuntimeError(
                f"no installed {DEVICE_PLUGIN_ENTRY_POINT_GROUP} entry point or backend named "
                f"{args.name!r}"
            )
        # An in-tree backend: the same checks, minus the entry-point import.
        return _report(f"{args.name} ({backend.source.describe()})",
                       diagnose_backend(registry, backend))  # fmt: skip
    if not eps:
        print(f"no {DEVICE_PLUGIN_ENTRY_POINT_GROUP} entry points installed")
        return 0
    status = 0
    for ep in eps:
        status |= _report(_label(ep), check_entry_point(registry, ep, args.max_import_seconds))
    return status


def _report(label: str, found: list[Diagnosis]) -> int:
    if not found:
        print(f"{label}: ok")
        return 0
    print(f"{label}:")
    for diagnosis in found:
        print(f"  {diagnosis.line()}")
    return 1 if any(d.severity == PROBLEM for d in found) else 0


def run_new(args: argparse.Namespace) -> int:
    from lmcache.cli.scaffold import scaffold_plugin

    output = args.output or Path.cwd() / f"lmcache-{args.name.replace('_', '-')}"
    written = scaffold_plugin(
        args.name, output, device_type=args.device_type or args.name, native=args.native
    )
    print(f"wrote {len(written)} files to {output}")
    for path in written:
        print(f"  {path.relative_to(output)}")
    return 0
