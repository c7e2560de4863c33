"""The memory package: the old module re-exports every name, and the layers point down."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import lmcache.v1.memory_management as compat

# Every public name lmcache.v1.memory_management had before the split, and its new home.
_HOMES = {
    "MemoryFormat": "format",
    "ShapesArg": "format",
    "DtypesArg": "format",
    "normalize_shapes_dtypes": "format",
    "tensor_nbytes": "format",
    "PART_ALIGNMENT": "format",
    "part_offsets": "format",
    "MemoryObjMetadata": "base",
    "MemoryObj": "base",
    "MemoryAllocatorInterface": "base",
    "TensorMemoryObj": "objects",
    "BytesBufferMemoryObj": "objects",
    "FreeBlock": "allocator",
    "HostMemoryAllocator": "allocator",
    "SHM_DIR": "shm",
    "attach_shared_buffer": "shm",
}

# Upstream's private host-buffer helpers, re-exported under upstream's names from
# lmcache.v1.memory.host_buffers (upstream name -> our name).
_HOST_BUFFER_HELPERS = {
    "_allocate_cpu_memory": "allocate_cpu_memory",
    "_free_cpu_memory": "free_cpu_memory",
    "_read_hugepage_info": "read_hugepage_info",
    "_get_cached_ubyte_array_type": "cached_ubyte_array_type",
}

_V1 = Path(compat.__file__).parent
# Packages above the memory layer: memory must not import them.
_ABOVE_MEMORY = (
    "lmcache.v1.storage_backend",
    "lmcache.v1.multiprocess",
    "lmcache.integration",
    "lmcache.cli",
    "lmcache.bench",
)


@pytest.mark.parametrize("name", sorted(_HOMES))
def test_old_path_re_exports_the_new_object(name: str) -> None:
    home = importlib.import_module(f"lmcache.v1.memory.{_HOMES[name]}")
    assert getattr(compat, name) is getattr(home, name)
    assert name in compat.__all__


@pytest.mark.parametrize("name", sorted(_HOST_BUFFER_HELPERS))
def test_old_path_has_upstreams_host_buffer_helpers_added_by_compat(name: str) -> None:
    # Added by the path table's UPSTREAM_EXTRAS row, not exported by the product file.
    home = importlib.import_module("lmcache.compat.upstream_056.host_buffers")
    assert getattr(compat, name) is getattr(home, _HOST_BUFFER_HELPERS[name])
    assert name not in compat.__all__


def test_old_path_exports_nothing_else() -> None:
    assert sorted(compat.__all__) == sorted(_HOMES)


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _imports_under(package_dir: Path) -> dict[str, set[str]]:
    return {str(p): _imported_modules(p) for p in sorted(package_dir.rglob("*.py"))}


def test_memory_imports_nothing_above_it() -> None:
    imports = _imports_under(_V1 / "memory")
    assert imports, "no memory modules found"
    upward = {
        path: sorted(m for m in mods if m.startswith(_ABOVE_MEMORY) or "memory_management" in m)
        for path, mods in imports.items()
    }
    assert not {p: m for p, m in upward.items() if m}


def test_platform_never_imports_memory() -> None:
    imports = _imports_under(_V1 / "platform")
    assert imports, "no platform modules found"
    upward = {
        path: sorted(m for m in mods if m.startswith(("lmcache.v1.memory", "lmcache.v1.memory_")))
        for path, mods in imports.items()
    }
    assert not {p: m for p, m in upward.items() if m}
