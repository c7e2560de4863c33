"""A missing prerequisite is a skip on a developer's machine and a failure under nox/CI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prerequisites import (
    missing_prerequisite,
    prerequisites_required,
    require_module,
    require_prerequisite,
)

GATES = ("CI", "LMCACHE_TEST_REQUIRE_INSTALLED", "LMCACHE_TEST_REQUIRE_DEMO")


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in GATES:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("env", "required"),
    [
        ({}, False),
        ({"CI": ""}, False),
        ({"CI": "false"}, False),
        ({"CI": "0"}, False),
        ({"CI": "true"}, True),
        ({"CI": "1"}, True),
        ({"LMCACHE_TEST_REQUIRE_INSTALLED": "1"}, True),
        ({"LMCACHE_TEST_REQUIRE_INSTALLED": "0"}, False),
    ],
)
def test_when_prerequisites_are_required(env: dict[str, str], required: bool) -> None:
    assert prerequisites_required(env) is required


def test_missing_is_a_skip_locally(local: pytest.MonkeyPatch) -> None:
    with pytest.raises(pytest.skip.Exception, match="missing prerequisite thing: why"):
        missing_prerequisite("thing", "why")
    require_prerequisite("thing", True, "never raised when available")


@pytest.mark.parametrize("var", ["CI", "LMCACHE_TEST_REQUIRE_INSTALLED"])
def test_missing_is_a_failure_under_nox_and_ci(local: pytest.MonkeyPatch, var: str) -> None:
    local.setenv(var, "1")
    with pytest.raises(pytest.fail.Exception, match=f"thing: why .*{var}"):
        require_prerequisite("thing", False, "why")


def test_module_that_is_absent(local: pytest.MonkeyPatch) -> None:
    with pytest.raises(pytest.skip.Exception, match="no_such_module_here"):
        require_module("no_such_module_here", "for this test")
    local.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no_such_module_here"):
        require_module("no_such_module_here", "for this test")
    assert require_module("json", "stdlib").dumps(1) == "1"


def test_own_gate_ignores_ci(local: pytest.MonkeyPatch) -> None:
    """Absent by design in the plain sessions (vLLM): a skip even in CI, a failure only
    where its own variable says it is the point of the session."""
    local.setenv("CI", "true")
    with pytest.raises(pytest.skip.Exception):
        missing_prerequisite("demo", "absent by design", required_env="LMCACHE_TEST_REQUIRE_DEMO")
    local.setenv("LMCACHE_TEST_REQUIRE_DEMO", "1")
    with pytest.raises(pytest.fail.Exception, match="LMCACHE_TEST_REQUIRE_DEMO=1"):
        missing_prerequisite("demo", "absent by design", required_env="LMCACHE_TEST_REQUIRE_DEMO")


def test_every_test_that_needs_vllm_carries_the_vllm_marker() -> None:
    """vllm-e2e runs ``-m vllm`` only: a vLLM test without the marker would run nowhere
    but tests(core), where it skips."""
    root = Path(__file__).parent
    needs_vllm = ('required_env="LMCACHE_TEST_REQUIRE_VLLM"', "from test_server_restart import")
    unmarked = [
        path.relative_to(root).as_posix()
        for path in sorted(root.rglob("test_*.py"))
        if path != Path(__file__)
        and any(needle in path.read_text() for needle in needs_vllm)
        and not _module_marked(path, "vllm")
    ]
    assert len(list(root.rglob("test_server_restart.py"))) == 1
    assert unmarked == []


def test_every_test_that_needs_sglang_carries_the_sglang_marker() -> None:
    """sglang-cpu runs ``-m sglang`` only: an SGLang test without the marker would run
    nowhere but tests(core), where it skips."""
    root = Path(__file__).parent
    unmarked = [
        path.relative_to(root).as_posix()
        for path in sorted(root.rglob("test_*.py"))
        if path != Path(__file__)
        and 'required_env="LMCACHE_TEST_REQUIRE_SGLANG"' in path.read_text()
        and not _module_marked(path, "sglang")
    ]
    assert unmarked == []


def _module_marked(path: Path, marker: str) -> bool:
    """``pytestmark = pytest.mark.<marker>``, alone or in a list of marks."""
    pattern = rf"^pytestmark = (\[[^\]]*)?pytest\.mark\.{marker}\b"
    return re.search(pattern, path.read_text(), flags=re.M) is not None


def test_a_marker_in_a_list_of_marks_counts(tmp_path: Path) -> None:
    alone, listed, other = (tmp_path / f"{n}.py" for n in ("alone", "listed", "other"))
    alone.write_text("pytestmark = pytest.mark.vllm\n")
    listed.write_text("pytestmark = [pytest.mark.timeout(9), pytest.mark.vllm]\n")
    other.write_text("pytestmark = [pytest.mark.sglang]\n# pytest.mark.vllm\n")
    assert _module_marked(alone, "vllm") and _module_marked(listed, "vllm")
    assert not _module_marked(other, "vllm")
