"""``lmcache plugin new``: write a complete external device-plugin repository.

The result builds, installs and passes its own tests (which run the core's conformance
suite, :mod:`lmcache.testing`, against the backend by name) on a CPU machine when
``device_type`` is ``cpu``.  Its priority defaults to just below every known backend of
its device type (:func:`~lmcache.cli.scaffold.names.default_priority`), so installing it
displaces nothing until the vendor passes ``--priority``; the name must be free
(:func:`~lmcache.cli.scaffold.names.check_name_is_free`).
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

from lmcache.cli.scaffold import project_files as proj
from lmcache.cli.scaffold import python_files as py
from lmcache.cli.scaffold.names import check_name_is_free, default_priority
from lmcache.distributions import CORE_DISTRIBUTION, WHEELHOUSE_ENV_VAR, core_requirement

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _check_name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{what} {value!r} must be lowercase letters, digits and '_' (starting with a letter)"
        )
    return value


def template_values(name: str, device_type: str, native: bool, priority: int = 0) -> dict[str, str]:
    _check_name(name, "backend name")
    _check_name(device_type, "device type")
    pkg = f"lmcache_{name}"
    return {
        "name": name,
        "device_type": device_type,
        "pkg": pkg,
        "dist": f"lmcache-{name.replace('_', '-')}",
        "cls": "".join(part.capitalize() for part in name.split("_")),
        "priority": str(priority),
        "core_requirement": core_requirement(),
        "core_testing_requirement": core_requirement().replace(
            CORE_DISTRIBUTION, f"{CORE_DISTRIBUTION}[testing]", 1
        ),
        "wheelhouse_var": WHEELHOUSE_ENV_VAR,
        "disable_var": f"LMCACHE_{name.upper()}_DISABLE_NATIVE",
        "build_needs": "a C++17 compiler and CMake >= 3.18" if native else "nothing native",
    }


def plugin_files(name: str, device_type: str, native: bool, priority: int = 0) -> dict[str, str]:
    """Relative path -> text of every file of the repository."""
    values = template_values(name, device_type, native, priority)
    pkg = values["pkg"]
    copy_many = Template(py.COPY_MANY_NATIVE if native else py.COPY_MANY_PURE)
    values["copy_many"] = copy_many.substitute(values)
    values["extra_import"] = "" if native else "import ctypes\n"
    templates = {
        "pyproject.toml": proj.PYPROJECT_NATIVE if native else proj.PYPROJECT_PURE,
        "README.md": proj.README,
        ".gitignore": proj.GITIGNORE,
        "noxfile.py": proj.NOXFILE,
        ".github/workflows/ci.yml": proj.CI,
        f"src/{pkg}/__init__.py": py.INIT,
        f"src/{pkg}/device.py": py.DEVICE_CPU if device_type == "cpu" else py.DEVICE_ACCEL,
        f"src/{pkg}/device_ops.py": py.DEVICE_OPS,
        f"src/{pkg}/native_ops.py": py.NATIVE_OPS,
        f"src/{pkg}/_kernels.py": py.KERNELS,
        "tests/test_conformance.py": py.TEST_CONFORMANCE,
        "tests/test_selected.py": py.TEST_SELECTED,
    }
    if native:
        templates["CMakeLists.txt"] = proj.CMAKE
        templates["csrc/module.cpp"] = proj.MODULE_CPP
    return {path: Template(text).substitute(values) for path, text in templates.items()}


def scaffold_plugin(
    name: str, output: Path, device_type: str, native: bool, priority: int | None = None
) -> list[Path]:
    """Write the repository into ``output`` (which must not exist or be empty); ``priority``
    None: :func:`~lmcache.cli.scaffold.names.default_priority`."""
    _check_name(name, "backend name")
    check_name_is_free(name)
    if priority is None:
        priority = default_priority(device_type)
    files = plugin_files(name, device_type, native, priority)
    if output.exists() and any(output.iterdir()):
        raise FileExistsError(f"{output} exists and is not empty")
    written = []
    for relative, text in sorted(files.items()):
        path = output / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
