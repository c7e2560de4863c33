"""Helpers shared by the vLLM end-to-end drivers: the server process, its stats, ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# Long enough for several 64-token chunks; words from the tiny tokenizer's vocabulary.
_SENTENCES = (
    "a cache stores key value tensors so that a prefix is computed only once "
    "the server keeps chunks of the kv cache in host memory and returns them on a hit"
)
LONG_PROMPT_WORDS = _SENTENCES.split(" ") * 12
CHUNK_SIZE = 64


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def connector_config(port: int, mode: str) -> dict[str, Any]:
    return {
        "kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        # A load the server cannot serve (it restarted) is recomputed, not an error.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": str(port),
            "lmcache.mp.mp_transfer_mode": mode,
        },
    }


def start_server(port: int, mode: str, log_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``lmcache server`` on 127.0.0.1:port; returns once it answers a ping."""
    cmd = [
        sys.executable,
        "-m",
        "lmcache.cli.main",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--l1-size-gb",
        "1",
        "--eviction-policy",
        "LRU",
        "--chunk-size",
        str(CHUNK_SIZE),
        "--supported-transfer-mode",
        mode,
        *extra,
    ]
    log = open(log_path, "wb")  # noqa: SIM115 - the child owns it until stop_server
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return wait_until_serving(proc, port, log_path)


def wait_until_serving(
    proc: subprocess.Popen[bytes], port: int, log_path: Path
) -> subprocess.Popen[bytes]:
    """Return ``proc`` once the server on 127.0.0.1:port answers a ping (60 s at most)."""
    from lmcache.v1.multiprocess.worker.client import MPClient, MPClientError

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"lmcache server exited early; see {log_path}")
        try:
            with MPClient(f"tcp://127.0.0.1:{port}", timeout=2, connect_timeout=2) as client:
                client.ping()
            return proc
        except MPClientError:
            time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"lmcache server did not come up in 60 s; see {log_path}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def server_stats(port: int) -> dict[str, Any]:
    import msgspec

    from lmcache.v1.multiprocess.worker.client import MPClient

    with MPClient(f"tcp://127.0.0.1:{port}", timeout=10) as client:
        return dict(msgspec.structs.asdict(client.get_stats()))


MAX_TOKENS = 12
BLOCK_SIZE = 32


def make_llm(model: str, kv_transfer: dict[str, Any] | None, **overrides: Any) -> Any:
    """The e2e ``vllm.LLM`` (tiny model, no prefix caching); ``overrides`` replace or add
    engine arguments."""
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kwargs: dict[str, Any] = {
        "model": model,
        "dtype": "float32",
        "block_size": BLOCK_SIZE,
        "max_model_len": 2048,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 2048,
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "seed": 0,
    }
    if kv_transfer is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(**kv_transfer)
    return LLM(**{**kwargs, **overrides})
