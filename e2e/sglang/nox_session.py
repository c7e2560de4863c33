"""The body of the ``sglang-cpu`` nox session (imported by ``noxfile.py``).

Installs SGLang 0.5.23 on CPU through :mod:`install` (the one recipe: pinned wheels with
``--no-deps``, the ``sgl_kernel``/``torchvision`` import stubs) with the cached
lmcache-core wheel, runs the connector tests with SGLang's real classes (``-m sglang``,
``LMCACHE_TEST_REQUIRE_SGLANG=1``: a missing SGLang fails), then the end-to-end run
(``run_e2e.py``: four SGLang starts against a real ``lmcache server``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# Test runner only (the connector tests import nothing else outside the recipe).
TEST_TOOLS = ("pytest", "pytest-timeout")


def _recipe() -> Any:
    spec = importlib.util.spec_from_file_location("sglang_install", HERE / "install.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install(session: Any, core_wheel: str | None = None) -> Any:
    """The SGLang CPU environment in the session's venv, by docs/sglang.md's command
    (``python e2e/sglang/install.py VENV``); returns the recipe module."""
    core = ["--core", core_wheel] if core_wheel else []
    session.run_install("python", str(HERE / "install.py"), session.virtualenv.location, *core)
    session.install(*TEST_TOOLS)
    return _recipe()


def run(session: Any, core_wheel: str | None = None) -> None:
    recipe = install(session, core_wheel)
    env = recipe.sglang_env({})
    env["LMCACHE_TEST_REQUIRE_SGLANG"] = "1"
    session.chdir(str(ROOT))
    session.run(
        "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "sglang",
        "tests/integration/sglang", env=env,
    )  # fmt: skip
    workdir = Path(session.create_tmp()) / "sglang-e2e"
    session.run("python", str(HERE / "run_e2e.py"), "--workdir", str(workdir), env=env)
