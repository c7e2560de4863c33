"""Templates of the scaffold's project files (``string.Template``: ``$name`` etc.)."""

from __future__ import annotations

PYPROJECT_PURE = """[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "LMCache device plugin $name (device type $device_type)."
requires-python = ">=3.10"
# The plugin interface (DeviceSpec, DeviceOps, the kernel kit) is pinned by this range.
# lmcache-core, not "lmcache": on a package index that name is upstream LMCache, whose
# install would replace this core's files.
dependencies = ["$core_requirement"]

[project.optional-dependencies]
test = ["$core_testing_requirement"]

[project.entry-points."lmcache.device_plugins"]
$name = "$pkg.device:${cls}DeviceSpec"

[tool.setuptools.packages.find]
where = ["src"]
"""

PYPROJECT_NATIVE = """[build-system]
requires = ["scikit-build-core>=0.10", "nanobind>=2"]
build-backend = "scikit_build_core.build"

[project]
name = "$dist"
version = "0.1.0"
description = "LMCache device plugin $name (device type $device_type), native kernels."
requires-python = ">=3.10"
# The plugin interface (DeviceSpec, DeviceOps, the kernel kit) is pinned by this range.
# lmcache-core, not "lmcache": on a package index that name is upstream LMCache, whose
# install would replace this core's files.
dependencies = ["$core_requirement"]

[project.optional-dependencies]
test = ["$core_testing_requirement"]

[project.entry-points."lmcache.device_plugins"]
$name = "$pkg.device:${cls}DeviceSpec"

[tool.scikit-build]
minimum-version = "build-system.requires"
build-dir = "build/{wheel_tag}"
wheel.packages = ["src/$pkg"]
cmake.build-type = "Release"
"""

CMAKE = """cmake_minimum_required(VERSION 3.18...3.30)
project($pkg LANGUAGES CXX)

set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
if(NOT CMAKE_BUILD_TYPE)
  set(CMAKE_BUILD_TYPE Release)
endif()

find_package(Python 3.10 REQUIRED COMPONENTS Interpreter Development.Module)
find_package(nanobind CONFIG REQUIRED)

# NB_STATIC: one self-contained .so; no libtorch (the kernels see raw addresses).
nanobind_add_module(_native NB_STATIC csrc/module.cpp)
target_compile_options(_native PRIVATE -O3 -Wall -Wextra)
install(TARGETS _native LIBRARY DESTINATION $pkg)
"""

MODULE_CPP = """// $pkg._native: the copy kernel the kernel kit's job records are lowered to.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace nb = nanobind;

namespace {

// One row copy per (dst, src) pair; addresses come from the kit's geometry.
void copy_many(const std::vector<std::uintptr_t>& dst, const std::vector<std::uintptr_t>& src,
               std::size_t nbytes) {
  if (dst.size() != src.size()) {
    throw std::invalid_argument("copy_many: dst and src differ in length");
  }
  for (std::size_t i = 0; i < dst.size(); ++i) {
    std::memmove(reinterpret_cast<void*>(dst[i]), reinterpret_cast<const void*>(src[i]),
                 nbytes);
  }
}

}  // namespace

NB_MODULE(_native, m) {
  m.def("copy_many", &copy_many, nb::arg("dst"), nb::arg("src"), nb::arg("nbytes"),
        nb::call_guard<nb::gil_scoped_release>());
}
"""

NOXFILE = '''"""Build the wheel, install it next to lmcache-core and run the conformance suite.

lmcache-core is not on a package index: ``$wheelhouse_var`` names a folder (or the URL of a
page listing wheels) holding its wheel; ``lmcache plugin wheelhouse DIR`` writes one, and
so does ``nox -s build`` in an lmcache checkout (into dist/).  Everything else (torch,
pytest, ...) comes from the package indexes as usual.
"""

import os
from pathlib import Path

import nox

TORCH = "torch==2.13.0"  # CPU wheels
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
WHEELHOUSE_VAR = "$wheelhouse_var"


def wheelhouse(session: nox.Session) -> str:
    """The folder or URL to find lmcache-core in; fails before anything is installed."""
    value = os.environ.get(WHEELHOUSE_VAR, "").strip()
    if not value:
        session.error(
            f"{WHEELHOUSE_VAR} is not set: point it at a folder holding the lmcache-core wheel "
            "(lmcache plugin wheelhouse DIR writes one); lmcache-core is not on a package index"
        )
    if "://" in value:
        return value
    folder = Path(value).expanduser().resolve()
    if not any(folder.glob("lmcache_core-*.whl")):
        session.error(
            f"{WHEELHOUSE_VAR}={value} holds no lmcache_core-*.whl "
            "(lmcache plugin wheelhouse DIR writes one)"
        )
    return str(folder)


@nox.session
def tests(session: nox.Session) -> None:
    find_links = wheelhouse(session)
    session.install(TORCH, "--index-url", TORCH_INDEX)
    session.install("--find-links", find_links, ".[test]")
    session.run("lmcache", "plugin", "check", "$name", "--bench")
    session.run("python", "-m", "pytest", "tests", "-q")
'''

CI = """name: ci
on: [push, pull_request]
env:
  # lmcache-core is not on a package index: a folder (or the URL of a page listing wheels)
  # holding its wheel. Commit one under wheelhouse/ (lmcache plugin wheelhouse wheelhouse),
  # or fetch it into that folder in a step before nox.
  $wheelhouse_var: $${{ github.workspace }}/wheelhouse
jobs:
  tests:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - run: python -m pip install nox
      - run: nox -s tests
"""

README = """# $dist

LMCache device plugin: backend `$name`, device type `$device_type`
(scaffolded by `lmcache plugin new`).

    python -m pip wheel --no-deps -w dist .      # build (needs $build_needs)
    python -m pip install dist/*.whl             # install next to lmcache-core
    lmcache plugin check $name --bench           # problems, and speed against the baseline
    lmcache devices                              # is it discovered, available, selected?
    pytest tests                                 # the conformance suite (lmcache.testing)
    export $wheelhouse_var=/path/to/wheelhouse   # holds the lmcache-core wheel
    nox -s tests                                 # the same, in a fresh environment (and CI)

lmcache-core is not on a package index: `nox -s tests` and `.github/workflows/ci.yml`
take its wheel from the folder (or URL) in `$wheelhouse_var`; `lmcache plugin wheelhouse
DIR` writes one from the installed core.  Priority $priority keeps this backend below the
other backends of device type `$device_type`; select it with
`LMCACHE_DEVICE_BACKEND=$name`, and raise the priority once `--bench` shows it is faster.

`$pkg/device.py` is the entry-point target (keep it cheap to import),
`$pkg/device_ops.py` binds `$pkg.native_ops` fail-soft (`$disable_var=1` keeps the
torch baseline), and `$pkg/_kernels.py` executes the kernel kit's job records.
"""

GITIGNORE = """build/
dist/
*.egg-info/
__pycache__/
.nox/
"""
