"""docs/compatibility.md lists exactly the upstream unit tests the ``upstream-unit`` nox
session leaves out (tests_interop/upstream_unit/run.py), so none is dropped silently."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path, PurePosixPath
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "compatibility.md"
RUNNER = ROOT / "tests_interop" / "upstream_unit" / "run.py"
START = "<!-- upstream-unit-list:start -->"
END = "<!-- upstream-unit-list:end -->"
ENTRY = re.compile(r"^- `([^`]+)`")


def _runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("upstream_unit_run", RUNNER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _documented_ids() -> list[str]:
    text = DOC.read_text()
    assert START in text and END in text, f"{DOC} lacks the {START} ... {END} block"
    block = text.split(START, 1)[1].split(END, 1)[0]
    return [m.group(1) for line in block.splitlines() if (m := ENTRY.match(line.strip()))]


def test_documented_list_matches_the_runner() -> None:
    runner = _runner()
    documented = _documented_ids()
    assert len(documented) == len(set(documented)), "an id is listed twice in the doc"
    assert sorted(documented) == sorted([*runner.IGNORED, *runner.DESELECTED])


def test_every_left_out_test_has_a_reason() -> None:
    runner = _runner()
    for test_id, reason in {**runner.IGNORED, **runner.DESELECTED}.items():
        assert len(reason.strip()) > 10, f"{test_id}: no real reason given"


def test_plugin_files_are_selected_and_not_left_out() -> None:
    # Files run only with lmcache-cuda installed are real selected files that neither
    # list leaves out; the runner drops them (and says so) only where the plugin is absent.
    runner = _runner()
    for path in runner.CUDA_PLUGIN_FILES:
        assert runner._is_selected(PurePosixPath(path)) and path.endswith(".py"), path
        assert not runner._is_ignored(path, list(runner.IGNORED)), path
        assert path in runner._left_out(plugin_installed=False)
        assert path not in runner._left_out(plugin_installed=True)
