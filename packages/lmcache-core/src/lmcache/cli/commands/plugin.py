"""``lmcache plugin``: the vendor kit for device plugins.

``lmcache plugin check [NAME]`` validates the installed ``lmcache.device_plugins`` entry
points (all, or the one named) and prints one line per problem: the registry's own reasons
for skipping a plugin (import failure, not a class, raising constructor, entry-point name
!= lowercase ``backend_name``, duplicate), ``is_available()`` raising, an ops class of
another device type, a transfer mode declared without what it needs, priority ties with
other installed backends, an entry-point import that is slow or pulls in heavy modules, a
plugin distribution that requires upstream's ``lmcache`` instead of ``lmcache-core``, and
upstream's ``lmcache`` installed over this core.  A backend that would be selected over
another one of its device type is measured against it (a warning when it is slower);
``--bench`` measures every checked backend against the torch baseline and prints the
ratio.  Exit status 1 when any problem is found.

``lmcache plugin new NAME`` writes a complete external plugin repository (see
``lmcache plugin new --help``); ``lmcache plugin wheelhouse DIR`` writes the lmcache-core
wheel that repository installs from.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path
from typing import Any

from lmcache.distributions import WHEELHOUSE_ENV_VAR
from lmcache.v1.platform.diagnose import (
    DEFAULT_MAX_IMPORT_SECONDS,
    PROBLEM,
    Diagnosis,
    check_import_cost,
    check_requires_upstream,
    check_upstream_installed,
    diagnose_backend,
    diagnose_skipped,
)
from lmcache.v1.platform.registry import (
    DEVICE_PLUGIN_ENTRY_POINT_GROUP,
    DeviceRegistry,
    RegisteredBackend,
    build_registry,
)

CHECK_DESCRIPTION = (
    "Validate the installed lmcache.device_plugins entry points (all, or the one named): "
    "one line per problem or warning, exit status 1 on any problem.  A backend that would "
    "be selected over another available backend of its device type is measured against "
    "it, and a slower one is a warning."
)
NEW_DESCRIPTION = (
    "Write a complete device-plugin repository for backend NAME: pyproject.toml with the "
    "entry point, the DeviceSpec, DeviceOps over the kernel kit, the conformance tests, a "
    f"noxfile and a CI workflow.  It builds, installs and passes its own tests outside this "
    f"checkout (nox -s tests with {WHEELHOUSE_ENV_VAR} set).  NAME must not be taken by "
    "an in-tree backend, one of our plugins or an installed distribution.  Its priority "
    "defaults to just below every known backend of its device type, so installing it "
    "displaces nothing; --priority overrides that."
)
WHEELHOUSE_DESCRIPTION = (
    "Write the lmcache-core wheel (built from the source tree this command runs from, or "
    "packed from the installed distribution) into DIR: the folder a plugin repository's "
    f"noxfile and CI read from {WHEELHOUSE_ENV_VAR}, since lmcache-core is not on a "
    "package index.  Its dependencies and the testing extra come from the package indexes."
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plugin",
        help="Check installed device plugins, scaffold a new one, write the core's wheel.",
        description=__doc__,
    )
    actions = parser.add_subparsers(dest="plugin_command", metavar="ACTION", required=True)
    _register_check(actions)
    _register_new(actions)
    _register_wheelhouse(actions)


def _register_check(actions: Any) -> None:
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
    check.add_argument(
        "--bench",
        action="store_true",
        help="measure each available backend's multi_layer_block_kv_transfer against the "
        "torch baseline on its device and print the GB/s and the ratio",
    )
    check.set_defaults(func=run_check)


def _register_new(actions: Any) -> None:
    new = actions.add_parser(
        "new", help="Scaffold an external device-plugin repository.", description=NEW_DESCRIPTION
    )
    new.add_argument("name", help="backend name (lowercase letters, digits, _)")
    new.add_argument("--device-type", default=None, help="torch device type (default: NAME)")
    new.add_argument(
        "--native", action="store_true", help="add a nanobind + scikit-build-core native module"
    )
    new.add_argument(
        "--priority",
        type=int,
        default=None,
        help="the backend's priority; default: one below every known backend of the device "
        "type (0 for a new type), so it is selected only where asked for. A higher value "
        "makes it displace them as soon as it is installed",
    )
    new.add_argument("--output", type=Path, default=None, help="folder (default ./lmcache-NAME)")
    new.set_defaults(func=run_new)


def _register_wheelhouse(actions: Any) -> None:
    wheelhouse = actions.add_parser(
        "wheelhouse",
        help="Write the lmcache-core wheel a plugin repository installs from.",
        description=WHEELHOUSE_DESCRIPTION,
    )
    wheelhouse.add_argument("dir", type=Path, help="folder to write the wheel into (created)")
    wheelhouse.set_defaults(func=run_wheelhouse)


def _entry_points(name: str | None) -> list[importlib.metadata.EntryPoint]:
    eps = importlib.metadata.entry_points(group=DEVICE_PLUGIN_ENTRY_POINT_GROUP)
    return sorted((ep for ep in eps if name is None or ep.name == name), key=lambda e: e.name)


def _label(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    where = f"{dist.metadata['Name']} {dist.version}" if dist is not None else "unknown dist"
    return f"{ep.name} = {ep.value} ({where})"


def _registered_backend(
    registry: DeviceRegistry, ep: importlib.metadata.EntryPoint
) -> RegisteredBackend | None:
    backend = registry.backends.get(ep.name)
    if backend is not None and backend.source.entry_point == f"{ep.name} = {ep.value}":
        return backend
    return None


def check_entry_point(
    registry: DeviceRegistry, ep: importlib.metadata.EntryPoint, max_import_seconds: float
) -> list[Diagnosis]:
    found = diagnose_skipped(registry, [ep.name])
    backend = _registered_backend(registry, ep)
    if backend is not None:
        found.extend(diagnose_backend(registry, backend))
    else:  # skipped: its distribution's requirements still tell why it may be broken
        found.extend(check_requires_upstream(ep.name, getattr(ep, "dist", None)))
    if not any("import failed" in d.message for d in found):
        found.extend(check_import_cost(ep.name, ep.value.split(":", 1)[0], max_import_seconds))
    return found


def _check_one(
    registry: DeviceRegistry,
    label: str,
    found: list[Diagnosis],
    backend: RegisteredBackend | None,
    bench: bool,
) -> int:
    lines: list[str] = []
    if backend is not None and not any(d.severity == PROBLEM for d in found):
        from lmcache.cli.plugin_speed import check_speed  # torch and the bench: only here

        slower, report = check_speed(registry, backend, always=bench)
        found = found + slower
        if report is not None and bench:
            lines = report.lines()
    status = _report(label, found)
    for line in lines:
        print(f"  {line}")
    return status


def run_check(args: argparse.Namespace) -> int:
    registry = build_registry()
    status = _report_installation()
    eps = _entry_points(args.name)
    if args.name is not None and not eps:
        backend = registry.backends.get(args.name)
        if backend is None:
            raise RuntimeError(
                f"no installed {DEVICE_PLUGIN_ENTRY_POINT_GROUP} entry point or backend named "
                f"{args.name!r}"
            )
        # An in-tree backend: the same checks, minus the entry-point import.
        label = f"{args.name} ({backend.source.describe()})"
        found = diagnose_backend(registry, backend)
        return status | _check_one(registry, label, found, backend, args.bench)
    if not eps:
        print(f"no {DEVICE_PLUGIN_ENTRY_POINT_GROUP} entry points installed")
        return status
    for ep in eps:
        found = check_entry_point(registry, ep, args.max_import_seconds)
        backend = _registered_backend(registry, ep)
        status |= _check_one(registry, _label(ep), found, backend, args.bench)
    return status


def _report_installation() -> int:
    """Upstream's lmcache installed over this core breaks every plugin: said first."""
    found = check_upstream_installed()
    for diagnosis in found:
        print(diagnosis.line())
    return 1 if found else 0


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
        args.name,
        output,
        device_type=args.device_type or args.name,
        native=args.native,
        priority=args.priority,
    )
    print(f"wrote {len(written)} files to {output}")
    for path in written:
        print(f"  {path.relative_to(output)}")
    return 0


def run_wheelhouse(args: argparse.Namespace) -> int:
    from lmcache.cli.wheelhouse import write_core_wheel

    wheel = write_core_wheel(args.dir)
    print(f"wrote {wheel}")
    print(f"export {WHEELHOUSE_ENV_VAR}={args.dir.resolve()}")
    return 0
