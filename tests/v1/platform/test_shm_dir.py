"""``SHM_DIR`` has one home, the platform's cpu shm layer; every other module imports it."""

from __future__ import annotations

import ast
from pathlib import Path

import lmcache
from lmcache.v1.platform.cpu import shm

HOME = Path(shm.__file__).resolve()
SOURCES = sorted(Path(lmcache.__file__).resolve().parent.rglob("*.py"))


def _shm_dir_literals(path: Path) -> list[int]:
    """Lines of ``path`` spelling the directory itself as a string literal."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in ("/dev/shm", "/dev/shm/")
    ]


def test_dev_shm_is_spelled_once_in_the_core() -> None:
    spelled = {
        str(path.relative_to(HOME.parents[4])): lines
        for path in SOURCES
        if (lines := _shm_dir_literals(path))
    }
    assert spelled == {"lmcache/v1/platform/cpu/shm.py": [_shm_dir_literals(HOME)[0]]}


def test_modules_that_name_shm_dir_reexport_the_one_value() -> None:
    from lmcache.integration.vllm import autostart
    from lmcache.v1.memory import shm as memory_shm
    from lmcache.v1.multiprocess.transfer_context import transports
    from lmcache.v1.platform.cpu import posix_shm

    assert shm.SHM_DIR == "/dev/shm"
    for module in (memory_shm, transports, posix_shm):
        assert module.SHM_DIR is shm.SHM_DIR, module.__name__
    assert autostart.LOCK_DIRS == (shm.SHM_DIR,)
