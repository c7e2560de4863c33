"""Registry rules: how the backend is registered, named and ranked."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from lmcache.v1.platform.diagnose import PROBLEM, diagnose_backend
from lmcache.v1.platform.registry import DEVICE_PLUGIN_ENTRY_POINT_GROUP, get_registry


def test_names_are_lowercase_and_non_empty(spec: Any) -> None:
    for value in (spec.backend_name, spec.device_type):
        assert isinstance(value, str) and value and value == value.lower().strip()


def test_entry_point_name_is_backend_name(registered: Any) -> None:
    if registered.source.kind != "entry-point":
        return  # in-tree backends are found by the package scan, without entry points
    name, _, value = registered.source.entry_point.partition(" = ")
    assert name == registered.backend_name
    eps = importlib.metadata.entry_points(group=DEVICE_PLUGIN_ENTRY_POINT_GROUP)
    assert any(ep.name == name and ep.value == value for ep in eps)


def test_spec_class_has_a_no_argument_constructor(spec: Any) -> None:
    again = type(spec)()
    assert again.backend_name == spec.backend_name
    assert again.device_type == spec.device_type


def test_is_available_returns_a_bool(spec: Any) -> None:
    assert isinstance(spec.is_available(), bool)


def test_plugin_check_finds_no_problem(registered: Any) -> None:
    problems = [
        d.line() for d in diagnose_backend(get_registry(), registered) if d.severity == PROBLEM
    ]
    assert problems == []


def test_ops_class_serves_the_spec_device_type(spec: Any) -> None:
    ops_type = spec.ops_cls.device_type
    assert ops_type in ("", spec.device_type)


def test_default_transfer_mode_is_concrete(spec: Any) -> None:
    mode = spec.default_mp_transfer_mode()
    assert mode.value in ("lmcache_driven", "engine_driven")
    if mode.value == "lmcache_driven":  # AUTO may only pick a mode the backend can run
        assert spec.is_lmcache_driven_available()
