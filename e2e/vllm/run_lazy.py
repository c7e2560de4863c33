"""End-to-end: lazy offload (``lmcache.mp.lazy_offload``) with a real vLLM (CPU).

``run_e2e.py --lazy-offload`` runs these steps with its baseline.  One ``vllm.LLM`` with
prefix caching, a small KV cache (``num_gpu_blocks_override``) and the connector in lazy
mode (the default ``EVICTION_AWARE`` policy):

1. request A: its KV stays in vLLM's prefix cache; the server stores nothing (deferred);
2. requests B, C, ...: they take blocks from the head of vLLM's free queue, A's blocks
   drift towards it, and A is stored before vLLM evicts them;
3. once A's first block has been evicted from vLLM's cache, A again: vLLM's prefix cache
   cannot serve it, LMCache does (the server's retrieved tokens grow);
4. every prompt once more: each output equals the baseline token for token, so nothing
   stale was stored, whichever of B, C, ... were stored or dropped;
5. ``reset_prefix_cache(reset_connector=True)`` empties the server (``clear``; the server
   runs with ``--enable-admin-ops``).

``run_lazy_under_pressure`` then starts a vLLM whose KV cache holds one prompt, not two,
and sends A and B at once: B waits for room, so vLLM would hand A's blocks to B in the
step after A finished -- before a lazy release could store them.  A is stored anyway:
the connector asks vLLM to keep A's blocks (``delay_free_blocks``) until the next step
stored them.  A asked again loads from LMCache what vLLM's cache lost to B, and both
outputs equal the baseline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e_common import (
    LONG_PROMPT_WORDS,
    connector_config,
    free_port,
    make_llm,
    server_stats,
    start_server,
    stop_server,
)

MODE = "engine_driven"
# Room for four prompts of ~12 blocks: the fifth evicts the first.
NUM_BLOCKS = 48
NUM_PROMPTS = 5
# Room for one prompt and a bit: the second one waits, then takes some of the first's.
PRESSURE_BLOCKS = 20


def lazy_prompts() -> list[str]:
    """Prompts with no common prefix (each starts with a different word), the first of
    which is ``run_e2e``'s prompt."""
    words = LONG_PROMPT_WORDS
    return [" ".join(words[k:] + words[:k]) for k in range(NUM_PROMPTS)]


def make_lazy_llm(model: str, port: int, num_blocks: int = NUM_BLOCKS, **overrides: Any) -> Any:
    kv = connector_config(port, MODE)
    kv["kv_connector_extra_config"]["lmcache.mp.lazy_offload"] = "true"
    engine_args: dict[str, Any] = {
        "max_model_len": 1024,
        "max_num_seqs": 1,
        "max_num_batched_tokens": 1024,
        "enable_prefix_caching": True,
        "num_gpu_blocks_override": num_blocks,
        **overrides,
    }
    return make_llm(model, kv, **engine_args)


def run_lazy_under_pressure(
    model: str, prompts: list[str], baselines: list[list[int]], workdir: Path, max_tokens: int
) -> dict[str, Any]:
    """A and B at once into a KV cache that holds one of them (see the module doc)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    port = free_port()
    server = start_server(port, MODE, workdir / "server-lazy-pressure.log")
    try:
        engine = make_lazy_llm(model, port, PRESSURE_BLOCKS, max_model_len=512, max_num_seqs=2)
        both = engine.generate(prompts[:2], params, use_tqdm=False)
        outputs = [list(out.outputs[0].token_ids) for out in both]
        after_both = server_stats(port)
        # Under the old rule A's buffered store was dropped as stale here: nothing stored.
        assert after_both["stored_tokens"] > 0, f"A was not stored under pressure: {after_both}"
        a_again = list(engine.generate(prompts[:1], params, use_tqdm=False)[0].outputs[0].token_ids)
        after_a_again = server_stats(port)
        assert after_a_again["retrieved_tokens"] > after_both["retrieved_tokens"], (
            f"A's KV that B took from vLLM's cache did not come from LMCache: {after_a_again}"
        )
        for index, output in enumerate([*outputs, a_again]):
            baseline = baselines[index % 2]
            assert output == baseline, f"pressure output {index}: {output} != {baseline}"
        return {
            "kv_blocks": PRESSURE_BLOCKS,
            "stored_after_a_and_b": after_both["stored_tokens"],
            "retrieved_by_a_again": after_a_again["retrieved_tokens"]
            - after_both["retrieved_tokens"],
        }
    finally:
        stop_server(server)


def run_lazy_offload(
    model: str, prompts: list[str], baselines: list[list[int]], workdir: Path, max_tokens: int
) -> dict[str, Any]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    port = free_port()
    server = start_server(port, MODE, workdir / "server-lazy.log", "--enable-admin-ops")
    try:
        engine = make_lazy_llm(model, port)

        def generate(index: int) -> tuple[list[int], float]:
            t0 = time.perf_counter()
            out = engine.generate([prompts[index]], params, use_tqdm=False)[0]
            return list(out.outputs[0].token_ids), time.perf_counter() - t0

        outputs = [generate(0)[0]]
        after_a = server_stats(port)
        assert after_a["stored_tokens"] == 0, f"A was stored eagerly: {after_a}"
        outputs.append(generate(1)[0])
        after_b = server_stats(port)
        assert after_b["stored_tokens"] > 0, f"A was not stored as B came in: {after_b}"
        for index in range(2, len(prompts)):
            outputs.append(generate(index)[0])
        before_a_again = server_stats(port)
        a_again, a_again_s = generate(0)
        after_a_again = server_stats(port)
        assert after_a_again["retrieved_tokens"] > before_a_again["retrieved_tokens"], (
            f"A was not served by LMCache once vLLM had evicted it: {after_a_again}"
        )
        again = [a_again] + [generate(index)[0] for index in range(1, len(prompts))]
        final = server_stats(port)
        assert final["l1_chunks"] > 0, final
        assert engine.reset_prefix_cache(reset_connector=True), "the connector reset failed"
        after_reset = server_stats(port)
        assert after_reset["l1_chunks"] == 0, f"the reset left chunks: {after_reset}"
        for index, baseline in enumerate(baselines):
            assert outputs[index] == baseline, f"prompt {index}: {outputs[index]} != {baseline}"
            assert again[index] == baseline, f"prompt {index} again: {again[index]} != {baseline}"
        return {
            "stored_after_a": after_a["stored_tokens"],
            "stored_after_b": after_b["stored_tokens"],
            "retrieved_by_a_again": after_a_again["retrieved_tokens"]
            - before_a_again["retrieved_tokens"],
            "a_again_s": round(a_again_s, 4),
            "final_stats": final,
            "l1_chunks_before_reset": final["l1_chunks"],
        }
    finally:
        stop_server(server)


# run_e2e --lazy-offload: (summary key, step, its one-line report over the step's
# result), in order.
LAZY_STEPS: list[tuple[str, Callable[..., dict[str, Any]], str]] = [
    (
        "lazy_offload",
        run_lazy_offload,
        "lazy offload: OK, nothing stored after the first request, {stored_after_b} tokens "
        "once the next one came in; the first prompt again retrieved {retrieved_by_a_again} "
        f"tokens from LMCache after vLLM evicted it; all {NUM_PROMPTS} prompts twice equal "
        "the baseline; reset_prefix_cache(reset_connector=True) emptied the server "
        "({l1_chunks_before_reset} chunks before)",
    ),
    (
        "lazy_offload_pressure",
        run_lazy_under_pressure,
        "lazy offload under pressure: OK, {kv_blocks} KV blocks, the first of two prompts "
        "sent at once was stored ({stored_after_a_and_b} tokens) before the second took its "
        "blocks; asked again it retrieved {retrieved_by_a_again} tokens from LMCache; "
        "outputs equal the baseline",
    ),
]
