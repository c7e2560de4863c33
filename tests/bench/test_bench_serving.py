"""``lmcache bench serving`` without vLLM: its workloads, KV sizing, statistics, checks."""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import pytest

from lmcache.bench import _serving_workloads as wl
from lmcache.bench import serving

SHAPE = wl.Shape(
    users=3, rounds=3, system_tokens=40, question_tokens=5, output_tokens=4, docs=2,
    doc_tokens=50, questions=3,
)  # fmt: skip
VOCAB = 100


def test_chat_histories_grow_and_share_the_system_prompt() -> None:
    work = wl.build("chat", SHAPE, VOCAB)
    assert len(work.sessions) == SHAPE.users and work.requests == 9
    system = work.sessions[0][0].prompt[: SHAPE.system_tokens]
    for turns in work.sessions:
        assert turns[0].prompt[: SHAPE.system_tokens] == system
        for prev, nxt in itertools.pairwise(turns):
            # The next turn is the previous prompt + an answer + a new question.
            assert nxt.prompt[: len(prev.prompt)] == prev.prompt
            assert len(nxt.prompt) == len(prev.prompt) + SHAPE.output_tokens + SHAPE.question_tokens
    assert work.working_set_tokens == 40 + 3 * 3 * (5 + 4)
    assert all(wl.FIRST_ID <= t < VOCAB for s in work.sessions for r in s for t in r.prompt)


def test_docqa_asks_round_robin_over_the_documents() -> None:
    work = wl.build("docqa", SHAPE, VOCAB)
    assert work.requests == SHAPE.docs * SHAPE.questions
    firsts = [s[0].prompt[: SHAPE.doc_tokens] for s in work.sessions]
    # Users 0 and 1 start on different documents; user 2 is back on the first.
    assert firsts[0] != firsts[1] and firsts[2] == firsts[0]
    assert work.working_set_tokens == 2 * 50 + 6 * 5


def test_noreuse_prompts_share_no_prefix() -> None:
    work = wl.build("noreuse", SHAPE, VOCAB)
    heads = [r.prompt[:8] for s in work.sessions for r in s]
    assert len(set(heads)) == len(heads) == SHAPE.users * SHAPE.rounds


def test_workload_errors() -> None:
    with pytest.raises(ValueError, match="unknown workload 'x'"):
        wl.build("x", SHAPE, VOCAB)
    with pytest.raises(ValueError, match="too small"):
        wl.build("chat", SHAPE, 5)


def test_kv_blocks_follow_the_ratio_down_to_the_longest_request() -> None:
    work = wl.Workload("w", [[wl.Request(tuple(range(100)), 4)]], working_set_tokens=3200)
    assert wl.kv_blocks(work, 1, 32, 4) == 100
    assert wl.kv_blocks(work, 4, 32, 4) == 25
    # 100 tokens of prompt + 4 of output need 4 blocks, plus vLLM's null block.
    assert wl.kv_blocks(work, 1000, 32, 4) == 5
    with pytest.raises(ValueError, match="> 0"):
        wl.kv_blocks(work, 0, 32, 4)


def test_summarize_percentiles_and_throughput() -> None:
    replies = [
        wl.Reply(ttft_s=t / 1000, latency_s=1.0, prompt_tokens=10, output_tokens=3,
                 itl_s=[0.01, 0.02])
        for t in (10, 20, 30, 40, 50)
    ] + [wl.Reply(0.0, 0.0, 0, 0, error="HTTP 500")]  # fmt: skip
    row = wl.summarize(replies, wall_s=2.0)
    assert row["requests"] == 6 and row["errors"] == 1
    assert row["ttft_p50_ms"] == 30.0 and row["ttft_p90_ms"] == 46.0
    assert row["itl_p50_ms"] == 15.0
    # (latency 1.0 - ttft 0.03) / 2 further tokens, at the median request.
    assert row["tpot_p50_ms"] == 485.0
    assert row["request_throughput"] == 2.5 and row["output_throughput"] == 7.5
    assert row["total_token_throughput"] == 32.5
    assert wl.percentile([], 50) != wl.percentile([], 50)  # nan


def test_hit_rates_are_per_workload_deltas() -> None:
    before = dict.fromkeys(serving.COUNTERS, 0.0)
    before["vllm:prefix_cache_queries_total"] = 100
    after = dict(before)
    after["vllm:prefix_cache_queries_total"] = 300
    after["vllm:prefix_cache_hits_total"] = 50
    after["vllm:lmcache_mp_lookup_tokens_total"] = 200
    after["vllm:lmcache_mp_hit_tokens_total"] = 150
    rates = serving.hit_rates(before, after)
    assert rates["prefix_hit_rate"] == 0.25 and rates["lmcache_hit_rate"] == 0.75
    assert rates["external_hit_rate"] is None
    assert rates["counters"]["prefix_cache_queries"] == 200


def test_compare_against_prefix_and_upstream() -> None:
    def row(config: str, p50: float, thr: float) -> dict:
        return {"config": config, "workload": "chat", "kv_ratio": 2.0, "ttft_p50_ms": p50,
                "request_throughput": thr}  # fmt: skip

    rows = [row("prefix", 900, 1.0), row("engine_driven", 300, 1.5), row("upstream", 600, 1.2)]
    [prefix, ours, _upstream] = serving.compare(rows)
    assert "ttft_p50_speedup_vs_prefix" not in prefix
    assert ours["ttft_p50_speedup_vs_prefix"] == 3.0 and ours["throughput_vs_prefix"] == 1.5
    assert ours["ttft_p50_speedup_vs_upstream"] == 2.0 and ours["throughput_vs_upstream"] == 1.25


def test_kv_transfer_config_per_configuration() -> None:
    assert serving.kv_transfer_config("prefix", 1) is None
    lazy = serving.kv_transfer_config("lazy", 5555)
    assert lazy is not None
    extra = lazy["kv_connector_extra_config"]
    assert extra["lmcache.mp.lazy_offload"] == "true"
    assert extra["lmcache.mp.mp_transfer_mode"] == "engine_driven"
    driven = serving.kv_transfer_config("lmcache_driven", 5555)
    assert driven is not None
    assert driven["kv_connector_extra_config"]["lmcache.mp.mp_transfer_mode"] == "lmcache_driven"


def _args(tmp_path: Path, **over: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serving.add_arguments(parser)
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 50}))
    args = parser.parse_args(["--model", str(model)])
    for k, v in over.items():
        setattr(args, k, v)
    return args


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"configs": "prefix,bogus"}, "unknown configuration ['bogus']"),
        ({"workloads": "chat,x"}, "unknown workload ['x']"),
        ({"kv_ratios": "2,0"}, "--kv-ratios must be > 0"),
        ({"configs": "prefix,upstream"}, "needs --upstream-python"),
        ({"cpus": "auto"}, "explicit CPU list"),
    ],
)
def test_bad_arguments_fail_before_starting_anything(
    tmp_path: Path, over: dict, message: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        serving.run(_args(tmp_path, **over))
    assert message in str(exc.value)


def test_a_model_without_config_json_is_refused(tmp_path: Path) -> None:
    args = _args(tmp_path, model=str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match=r"no config\.json"):
        serving.run(args)


def test_unequal_bindings_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run() exits 2 without a table when the vLLM children report different bindings."""
    from lmcache.bench._vllm_cpu import CpuBinding

    bindings = iter([CpuBinding("auto", ((0,),), (1,)), CpuBinding("auto", ((0, 1),), ())])

    def fake_run(self: object, config: str, work: wl.Workload, ratio: float, blocks: int,
                 tag: str) -> tuple[dict, CpuBinding]:  # fmt: skip
        return {"config": config, "workload": work.name, "kv_ratio": ratio, "errors": 0}, next(
            bindings
        )

    monkeypatch.setattr(serving.Cell, "run", fake_run)
    out = tmp_path / "out.json"
    args = _args(tmp_path, configs="prefix,engine_driven", workloads="chat", kv_ratios="2",
                 quick=True, json=str(out), workdir=str(tmp_path / "w"))  # fmt: skip
    assert serving.run(args) == 2
    doc = json.loads(out.read_text())
    assert "different CPU bindings" in doc["refused"]
    assert doc["conditions"]["start"]["load_average"] is not None
