"""The external-wheel loading rules, checked against real installed plugin wheels.

The wheels come from ``tests/plugins/*`` (nox builds and installs them).  Each test fails
if the rule it names is removed from the registry.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest
from prerequisites import require_prerequisite

from lmcache.v1.platform.registry import build_registry

TEST_PLUGIN_DISTS = (
    "good",
    "importerror",
    "wrongtype",
    "instance",
    "raising",
    "mismatch",
    "duplicate",
    "uppercase",
    "twins",
)


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(f"lmcache-testplugin-{name}")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module", autouse=True)
def _plugin_wheels_installed() -> None:
    missing = [n for n in TEST_PLUGIN_DISTS if not _installed(n)]
    require_prerequisite(
        "registry test plugin wheels",
        not missing,
        f"lmcache-testplugin-{{{','.join(missing)}}} not installed (nox installs tests/plugins/*)",
    )


@pytest.fixture(scope="module")
def registry() -> Any:
    return build_registry(env={})


def _skipped(registry: Any, name: str) -> Any:
    matches = [s for s in registry.skipped if s.name == name]
    assert matches, f"{name!r} was not skipped; skipped = {registry.skipped}"
    return matches[0]


def test_good_plugin_is_registered_with_its_distribution(registry: Any) -> None:
    backend = registry.backends["fakegood"]
    assert backend.source.kind == "entry-point"
    assert backend.source.distribution == "lmcache-testplugin-good"
    assert backend.source.version == "0.0.1"
    assert type(backend.spec).__name__ == "GoodSpec"


def test_spec_is_instantiated_once_and_cached(registry: Any) -> None:
    again = build_registry(env={})
    assert type(again.backends["fakegood"].spec) is type(registry.backends["fakegood"].spec)
    assert registry.backends["fakegood"].spec is registry.backends["fakegood"].spec


def test_import_error_is_logged_with_distribution_and_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="lmcache"):
        registry = build_registry(env={})
    skipped = _skipped(registry, "brokenimport")
    assert "ImportError" in skipped.reason
    assert "lmcache-testplugin-importerror 0.0.1" in skipped.source
    assert any(
        "brokenimport" in r.getMessage() and "lmcache-testplugin-importerror" in r.getMessage()
        for r in caplog.records
    )
    assert "fakegood" in registry.backends  # other plugins unaffected


def test_factory_function_is_refused(registry: Any) -> None:
    assert "wrongtype" not in registry.backends
    assert "DeviceSpec subclass" in _skipped(registry, "wrongtype").reason


def test_instance_is_refused(registry: Any) -> None:
    assert "instance" not in registry.backends
    assert "instance of" in _skipped(registry, "instance").reason


def test_raising_constructor_is_skipped(registry: Any) -> None:
    assert "raising" not in registry.backends
    assert "refuses to be constructed" in _skipped(registry, "raising").reason


def test_entry_point_name_must_match_backend_name(registry: Any) -> None:
    assert "mismatch" not in registry.backends and "actualname" not in registry.backends
    assert "must match DeviceSpec.backend_name" in _skipped(registry, "mismatch").reason


def test_duplicate_backend_name_keeps_first_in_tree(registry: Any) -> None:
    assert registry.backends["cpu"].source.kind == "in-tree"
    assert "already registered" in _skipped(registry, "cpu").reason


def test_uppercase_backend_name_is_refused(registry: Any) -> None:
    assert not any(name.lower() == "uppercase" for name in registry.backends)
    assert "lowercase" in _skipped(registry, "uppercase").reason


def test_autoload_kill_switch_skips_entry_points() -> None:
    registry = build_registry(env={"LMCACHE_DEVICE_PLUGINS_AUTOLOAD": "0"})
    assert "fakegood" not in registry.backends
    assert "cpu" in registry.backends


AVAILABLE = {"LMCACHE_TEST_PLUGINS_AVAILABLE": "1"}
SELECT = """
import json
from lmcache.v1.platform.registry import select_backend
try:
    s = select_backend()
    print(json.dumps({"backend": s.backend.backend_name, "reason": s.reason}))
except RuntimeError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def test_unavailable_plugins_do_not_change_selection(run_python_json: Any) -> None:
    assert run_python_json(SELECT)["backend"] in {"cpu", "cpu_native"}


def test_tie_between_available_backends_is_an_error(run_python_json: Any) -> None:
    result = run_python_json(SELECT, {**AVAILABLE, "DEVICE_TYPE": "twindev"})
    assert "twina" in result["error"] and "twinb" in result["error"]
    assert "LMCACHE_DEVICE_BACKEND" in result["error"]


def test_explicit_backend_breaks_the_tie(run_python_json: Any) -> None:
    result = run_python_json(
        SELECT, {**AVAILABLE, "DEVICE_TYPE": "twindev", "LMCACHE_DEVICE_BACKEND": "twinb"}
    )
    assert result["backend"] == "twinb"


def test_highest_priority_wins(run_python_json: Any) -> None:
    result = run_python_json(SELECT, {**AVAILABLE, "DEVICE_TYPE": "priodev"})
    assert result["backend"] == "priob"
    assert "priority 2" in result["reason"]


def test_explicit_unavailable_backend_is_an_error(run_python_json: Any) -> None:
    result = run_python_json(SELECT, {"LMCACHE_DEVICE_BACKEND": "fakegood"})
    assert "not available" in result["error"]


def test_explicit_skipped_backend_explains_why(run_python_json: Any) -> None:
    result = run_python_json(SELECT, {"LMCACHE_DEVICE_BACKEND": "raising"})
    assert "not registered" in result["error"] and "refuses to be constructed" in result["error"]


def test_unavailable_device_type_falls_back_to_auto(run_python_json: Any) -> None:
    result = run_python_json(SELECT, {"DEVICE_TYPE": "fakedev"})
    assert result["backend"] in {"cpu", "cpu_native"}


def test_available_accelerator_is_preferred_over_cpu(run_python_json: Any) -> None:
    # Auto-detection walks device types in registry order with cpu last; fakedev is the
    # first accelerator type with exactly one available backend.
    result = run_python_json(SELECT, {**AVAILABLE, "LMCACHE_DEVICE_BACKEND": ""})
    assert result["backend"] == "fakegood"
    assert result["reason"].startswith("auto-detected accelerator")
