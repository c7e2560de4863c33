"""Our ``lmcache.v1.utils.router_discovery`` (upstream 0.5.6's API): cases upstream's
test_http_api_registry.py does not cover."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import APIRouter

from lmcache.compat.upstream_056.router_discovery import discover_api_routers

_ROUTER = "from fastapi import APIRouter\nrouter = APIRouter(prefix={prefix!r})\n"


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An importable, uniquely named package directory; its modules are unloaded after."""
    root = tmp_path / f"apis_{tmp_path.name}"
    root.mkdir()
    (root / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [n for n in sys.modules if n == root.name or n.startswith(root.name + ".")]:
        del sys.modules[name]


def test_routers_come_in_module_name_order(package: Path) -> None:
    for name in ("zeta_api", "alpha_api", "mid_api"):
        (package / f"{name}.py").write_text(_ROUTER.format(prefix=f"/{name}"))
    routers = discover_api_routers(package, package.name)
    assert [r.prefix for r in routers] == ["/alpha_api", "/mid_api", "/zeta_api"]


def test_custom_suffix(package: Path) -> None:
    (package / "a_api.py").write_text(_ROUTER.format(prefix="/a"))
    (package / "b_routes.py").write_text(_ROUTER.format(prefix="/b"))
    [router] = discover_api_routers(package, package.name, suffix="_routes")
    assert router.prefix == "/b"


def test_a_subpackage_named_like_an_api_counts(package: Path) -> None:
    sub = package / "nested_api"
    sub.mkdir()
    (sub / "__init__.py").write_text(_ROUTER.format(prefix="/nested"))
    [router] = discover_api_routers(package, package.name)
    assert isinstance(router, APIRouter) and router.prefix == "/nested"


def test_a_broken_api_module_raises(package: Path) -> None:
    (package / "good_api.py").write_text(_ROUTER.format(prefix="/good"))
    (package / "broken_api.py").write_text("raise RuntimeError('broken on import')\n")
    with pytest.raises(RuntimeError, match="broken on import"):
        discover_api_routers(package, package.name)


def test_an_excluded_module_is_never_imported(package: Path) -> None:
    (package / "broken_api.py").write_text("raise RuntimeError('broken on import')\n")
    assert discover_api_routers(package, package.name, exclude=["broken_api"]) == []
    assert f"{package.name}.broken_api" not in sys.modules


def test_missing_directory_finds_nothing(tmp_path: Path) -> None:
    assert discover_api_routers(tmp_path / "absent", "absent") == []
