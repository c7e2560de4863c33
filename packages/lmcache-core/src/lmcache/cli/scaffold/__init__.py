"""``lmcache plugin new``: write a complete external device-plugin repository.

The result builds, installs and passes its own tests (which run the core's conformance
suite, :mod:`lmcache.testing`) on a CPU machine when ``device_type`` is ``cpu``: that
variant outranks the built-in cpu backends, so a vendor sees it selected at once.
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

from lmcache.cli.scaffold import project_files as proj
from lmcache.cli.scaffold import python_files as py

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# Above the in-tree cpu (0) and lmcache-cpu's cpu_native (10): selected on a CPU host.
CPU_PRIORITY = 100
ACCELERATOR_PRIORITY = 0


def _check_name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{what} {value!r} must be lowercase letters, digits and '_' (starting with a letter)"
        )
    return value


def template_values(name: str, device_type: str, native: bool) -> dict[str, str]:
    _check_name(name, "backend name")
    _check_name(device_type, "device type")
    pkg = f"lmcache_{name}"
    return {
        "name": name,
        "device_type": device_type,
        "pkg": pkg,
        "dist": f"lmcache-{name.replace('_', '-')}",
        "cls": "".join(part.capitalize() for part in name.split("_")),
        "priority": str(CPU_PRIORITY if device_type == "cpu" else ACCELERATOR_PRIORITY),
        "disable_var": f"LMCACHE_{name.upper()}_DISABLE_NATIVE",
        "build_needs": "a C++17 compiler and CMake >= 3.18" if native else "nothing native",
    }


def plugin_files(name: str, device_type: str, native: bool) -> dict[str, str]:
    """Relative path -> text of every file of the repository."""
    values = template_values(name, device_type, native)
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


def scaffold_plugin(name: str, output: Path, device_type: str, native: bool) -> list[Path]:
    """Write the repository into ``output`` (which must not exist or be empty)."""
    files = plugin_files(name, device_type, native)
    if output.exists() and any(output.iterdir()):
        raise FileExistsError(f"{output} exists and is not empty")
    written = []
    for relative, text in sorted(files.items()):
        path = output / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
