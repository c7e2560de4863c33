"""The request streams ``lmcache bench serving`` sends, and the statistics of their replies.

A workload is a list of sessions; sessions run concurrently (one asyncio task each), the
requests of one session one after another (a user waits for the answer before the next
turn).  Prompts are token ids (the OpenAI completions API takes them as a list), drawn
from ``[FIRST_ID, vocab)`` so any tokenizer's special ids stay out.

- ``chat``: ``users`` users share one system prompt; each turn appends a question and a
  stand-in answer (random ids of ``output_tokens`` length) to the user's history, so every
  prompt extends the user's previous one.
- ``docqa``: ``docs`` documents, ``questions`` questions each; request ``i`` asks about
  document ``i % docs`` (round robin, so the whole document set is the working set) and is
  sent by session ``i % users``.
- ``noreuse``: every prompt is fresh random ids: the control with nothing to reuse.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FIRST_ID = 4
WORKLOADS = ("chat", "docqa", "noreuse")


@dataclass(frozen=True)
class Shape:
    """Sizes of a workload, in tokens (one set for all three)."""

    users: int = 8
    rounds: int = 4
    system_tokens: int = 1024
    question_tokens: int = 64
    output_tokens: int = 32
    docs: int = 4
    doc_tokens: int = 2048
    questions: int = 8


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    max_tokens: int


@dataclass
class Workload:
    name: str
    sessions: list[list[Request]]
    # Distinct prompt tokens the workload keeps reusing (what a cache must hold).
    working_set_tokens: int

    @property
    def requests(self) -> int:
        return sum(len(s) for s in self.sessions)

    @property
    def longest_prompt(self) -> int:
        return max(len(r.prompt) for s in self.sessions for r in s)


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(FIRST_ID, vocab) for _ in range(n)]


def chat(shape: Shape, vocab: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    system = _ids(rng, shape.system_tokens, vocab)
    sessions = []
    for _user in range(shape.users):
        history = list(system)
        turns = []
        for _turn in range(shape.rounds):
            history += _ids(rng, shape.question_tokens, vocab)
            turns.append(Request(tuple(history), shape.output_tokens))
            history += _ids(rng, shape.output_tokens, vocab)  # the answer, stood in for
        sessions.append(turns)
    per_user = shape.rounds * (shape.question_tokens + shape.output_tokens)
    return Workload("chat", sessions, shape.system_tokens + shape.users * per_user)


def docqa(shape: Shape, vocab: int, seed: int = 0) -> Workload:
    rng = random.Random(seed + 1)
    docs = [_ids(rng, shape.doc_tokens, vocab) for _ in range(shape.docs)]
    sessions: list[list[Request]] = [[] for _ in range(shape.users)]
    total = shape.docs * shape.questions
    for i in range(total):
        prompt = docs[i % shape.docs] + _ids(rng, shape.question_tokens, vocab)
        sessions[i % shape.users].append(Request(tuple(prompt), shape.output_tokens))
    working = shape.docs * shape.doc_tokens + total * shape.question_tokens
    return Workload("docqa", [s for s in sessions if s], working)


def noreuse(shape: Shape, vocab: int, seed: int = 0) -> Workload:
    """As many requests as ``chat``, of its mean prompt length, none sharing a prefix."""
    rng = random.Random(seed + 2)
    mean_len = (
        shape.system_tokens
        + (shape.rounds + 1) * (shape.question_tokens + shape.output_tokens) // 2
    )
    sessions = [
        [
            Request(tuple(_ids(rng, mean_len, vocab)), shape.output_tokens)
            for _ in range(shape.rounds)
        ]
        for _ in range(shape.users)
    ]
    return Workload("noreuse", sessions, shape.users * shape.rounds * mean_len)


BUILDERS = {"chat": chat, "docqa": docqa, "noreuse": noreuse}


def build(name: str, shape: Shape, vocab: int, seed: int = 0) -> Workload:
    if name not in BUILDERS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    if vocab <= FIRST_ID + 1:
        raise ValueError(f"vocabulary of {vocab} ids is too small for random prompts")
    return BUILDERS[name](shape, vocab, seed)


def kv_blocks(workload: Workload, ratio: float, block_size: int, output_tokens: int) -> int:
    """vLLM KV blocks for a cache ``ratio`` times smaller than the working set, but never
    fewer than the longest request needs plus vLLM's reserved null block (vLLM refuses to
    start below that)."""
    if ratio <= 0:
        raise ValueError(f"working-set/KV ratio must be > 0, got {ratio}")
    wanted = math.ceil(workload.working_set_tokens / ratio / block_size)
    floor = math.ceil(max_model_len(workload, output_tokens) / block_size) + 1
    return max(wanted, floor)


def max_model_len(workload: Workload, output_tokens: int) -> int:
    """The longest request's prompt plus its output."""
    return workload.longest_prompt + output_tokens


@dataclass
class Reply:
    """One streamed completion as the client saw it."""

    ttft_s: float
    latency_s: float
    prompt_tokens: int
    output_tokens: int
    # Gaps between consecutive streamed tokens after the first.
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between closest ranks; nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(replies: Sequence[Reply], wall_s: float) -> dict[str, Any]:
    """TTFT and ITL percentiles (ms), request and token throughput of one workload run."""
    ok = [r for r in replies if r.error is None]
    ttft = [r.ttft_s for r in ok]
    itl = [gap for r in ok for gap in r.itl_s]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    row: dict[str, Any] = {
        "requests": len(replies),
        "errors": len(replies) - len(ok),
        "wall_s": round(wall_s, 3),
        "request_throughput": round(len(ok) / wall_s, 4) if wall_s > 0 else float("nan"),
        "output_throughput": round(out_tokens / wall_s, 2) if wall_s > 0 else float("nan"),
        "total_token_throughput": (
            round((out_tokens + prompt_tokens) / wall_s, 2) if wall_s > 0 else float("nan")
        ),
    }
    for q in (50, 90, 99):
        row[f"ttft_p{q}_ms"] = round(1000 * percentile(ttft, q), 2)
    for q in (50, 90, 99):
        row[f"itl_p{q}_ms"] = round(1000 * percentile(itl, q), 2)
    # Time per output token after the first, per request: unlike the gaps between streamed
    # chunks it does not shrink when the server or the network coalesces chunks.
    tpot = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    row["tpot_p50_ms"] = round(1000 * percentile(tpot, 50), 2)
    row["ttft_mean_ms"] = round(1000 * statistics.fmean(ttft), 2) if ttft else float("nan")
    return row
