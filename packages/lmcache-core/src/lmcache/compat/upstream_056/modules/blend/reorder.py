"""CacheBlend prompt reordering (upstream 0.5.6's ``modules.blend.reorder``).

Retrieval-augmented prompts often carry the same documents as an earlier prompt, in
another order. The KV cache only serves an exact prefix, so :func:`plan` looks for the
longest beginning of one earlier (cached) prompt ``H`` that can be spelled out of the new
prompt ``P``'s own tokens, and proposes serving ``P`` as that copy followed by the rest of
``P`` in its original order. Only token ids are needed; document boundaries are found by
matching.

Matching rules, all in tokens:

* a copied run ("piece") of ``P`` is at least :data:`LMIN` tokens long, and ``P``'s last
  ``LMIN`` tokens are never moved, so the end of the prompt (the question, the assistant
  header) stays last;
* between two pieces, up to :data:`GLUE` tokens (a separator) may be taken from anywhere
  in ``P`` when ``H`` has them there -- preferring tokens beside already-copied text;
* a plan must copy more whole chunks than ``P``'s own cached prefix already gives.

:class:`PromptStore` remembers the token ids of stored prompts, so the server can offer
:func:`plan` the candidates most likely to match. Pure Python and numpy; work is bounded
by a wall-clock deadline (:class:`PlanBudgetExceeded`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["GLUE", "LMIN", "NS", "PlanBudgetExceeded", "PromptStore", "plan"]

LMIN = 16
"""Shortest run of ``P`` copied as one piece; also how many final tokens stay last."""

GLUE = 3
"""Longest run (a separator) copied on its own between two pieces."""


class PlanBudgetExceeded(Exception):
    """The planning deadline passed; :func:`plan` keeps what it finished before."""


# Windows are keyed by a polynomial hash of their LMIN tokens (mod 2**64, numpy's uint64
# wraparound). Equal hashes only nominate a window: every match is verified token by
# token, so a collision costs time, never correctness.
_BASE = np.uint64(0x100000001B3)


def _window_hashes(tokens: np.ndarray) -> np.ndarray:
    """Hash of each ``LMIN``-token window of ``tokens`` (entry ``i`` covers ``[i, i+LMIN)``)."""
    count = len(tokens) - LMIN + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    t = tokens.astype(np.uint64)
    acc = t[:count].copy()
    for j in range(1, LMIN):
        acc = acc * _BASE + t[j : j + count]
    return acc


class _Copier:
    """Spells out the beginning of candidate prompts with one prompt ``P``'s runs."""

    def __init__(self, P: Sequence[int], deadline: float) -> None:
        self.Pn = np.asarray(P, dtype=np.int64)
        self.deadline = deadline
        hashes = _window_hashes(self.Pn)
        # A stable sort keeps the positions of equal hashes ascending (leftmost first).
        self._by_hash = np.argsort(hashes, kind="stable")
        self._sorted = hashes[self._by_hash]
        self._tick()

    def _tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise PlanBudgetExceeded

    def _positions(self, key: np.uint64) -> np.ndarray:
        """Ascending starts of ``P``'s windows hashed ``key``."""
        lo = int(np.searchsorted(self._sorted, key, side="left"))
        hi = int(np.searchsorted(self._sorted, key, side="right"))
        return self._by_hash[lo:hi]

    def _run_at(
        self, Hn: np.ndarray, Hw: np.ndarray, k: int, free: np.ndarray
    ) -> tuple[int, int] | None:
        """``(start, length)`` of the longest run of free ``P`` tokens equal to ``H[k:]``,
        at least ``LMIN`` long; the leftmost of equals."""
        if k >= len(Hw):
            return None
        found: tuple[int, int] | None = None
        longest = LMIN - 1
        P = self.Pn
        for i in self._positions(Hw[k]).tolist():
            if not free[i]:
                continue
            bound = min(len(P) - i, len(Hn) - k)  # shrinks as i grows
            if bound <= longest:
                break
            self._tick()
            stops = np.flatnonzero((P[i : i + bound] != Hn[k : k + bound]) | ~free[i : i + bound])
            length = int(stops[0]) if stops.size else bound
            if length > longest:
                found, longest = (i, length), length
        return found

    def _separator_at(
        self,
        Hn: np.ndarray,
        Hw: np.ndarray,
        k: int,
        free: np.ndarray,
        copied_end: int,
    ) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """A short run of ``P`` equal to ``H[k : k + g]`` (``g <= GLUE``) and the piece
        that then continues ``H``. Runs beside copied (or pinned) tokens are tried first,
        then the leftmost; a run ending beyond everything copied is refused, so the
        separator is never pulled out of the prompt's unmatched tail."""
        P = self.Pn
        n = len(P)
        for g in range(1, GLUE + 1):
            if k + g >= len(Hn):
                break
            # Skip lengths after which no window of P (free or not) could continue H.
            if k + g >= len(Hw) or not self._positions(Hw[k + g]).size:
                continue
            if n < g:
                continue
            ok = np.ones(n - g + 1, dtype=bool)
            for j in range(g):
                ok &= (P[j : n - g + 1 + j] == Hn[k + j]) & free[j : n - g + 1 + j]
            starts = np.flatnonzero(ok).tolist()
            beside = [
                i for i in starts if (i > 0 and not free[i - 1]) or (i + g < n and not free[i + g])
            ]
            beside_set = set(beside)
            for i in beside + [i for i in starts if i not in beside_set]:
                self._tick()
                free[i : i + g] = False  # the piece after the separator must not reuse it
                after = self._run_at(Hn, Hw, k + g, free)
                free[i : i + g] = True
                if after is not None and i + g <= max(copied_end, after[0] + after[1]):
                    return (i, i + g), after
        return None

    def copy(self, Hn: np.ndarray, keep_prefix: int) -> list[tuple[int, int]]:
        """Half-open ranges of ``P`` which, concatenated, equal the beginning of ``H``;
        the first is ``P``'s first ``keep_prefix`` tokens, which stay where they are."""
        n = len(self.Pn)
        free = np.ones(n, dtype=bool)
        free[:keep_prefix] = False
        free[max(n - LMIN, 0) :] = False  # the prompt's end is never moved
        Hw = _window_hashes(Hn)
        pieces: list[tuple[int, int]] = [(0, keep_prefix)] if keep_prefix else []
        copied_end = keep_prefix
        k = keep_prefix
        while k < len(Hn):
            run = self._run_at(Hn, Hw, k, free)
            if run is None:
                bridged = self._separator_at(Hn, Hw, k, free, copied_end)
                if bridged is None:
                    break
                (s, e), run = bridged
                pieces.append((s, e))
                free[s:e] = False
                copied_end = max(copied_end, e)
                k += e - s
            start, length = run
            pieces.append((start, start + length))
            free[start : start + length] = False
            copied_end = max(copied_end, start + length)
            k += length
        return pieces


def _order_from(P: np.ndarray, Hn: np.ndarray, pieces: list[tuple[int, int]]) -> list[int]:
    """The serving order: the pieces, then ``H``'s next token when ``P`` has it beside a
    cut inside the copied span (usually a separator, kept so the served prompt can itself
    be copied further later), then the rest of ``P`` in order."""
    placed = np.zeros(len(P), dtype=bool)
    order: list[int] = []
    for s, e in pieces:
        order.extend(range(s, e))
        placed[s:e] = True
    copied = sum(e - s for s, e in pieces)
    if copied < len(Hn):
        want = Hn[copied]
        for i in range(max(e for _, e in pieces)):
            if placed[i] or P[i] != want:
                continue
            if (i > 0 and placed[i - 1]) or (i + 1 < len(P) and placed[i + 1]):
                order.append(i)
                placed[i] = True
                break
    order.extend(np.flatnonzero(~placed).tolist())
    return order


def plan(
    P: Sequence[int],
    candidates: Sequence[Sequence[int]],
    chunk_size: int,
    baseline_chunks: int,
    deadline: float,
    keep_prefix: int = 0,
) -> list[int] | None:
    """The order to serve ``P`` in (``[P[i] for i in perm]``), or None to serve it as is.

    ``candidates`` are earlier prompts, newest first. Each one sharing ``P``'s first
    ``keep_prefix`` tokens is copied as far as the matching rules allow; the best copy
    has the most whole ``chunk_size`` chunks, then the most tokens, then the fewest
    pieces, and on a full tie the newest wins. It is used only if it copies more whole
    chunks than ``baseline_chunks`` (``P``'s own cached prefix). Past ``deadline``
    (``time.monotonic()``) planning stops; a copy finished before still counts.
    """
    best: tuple[tuple[int, int, int], list[tuple[int, int]], np.ndarray] | None = None
    copier: _Copier | None = None
    try:
        copier = _Copier(P, deadline)
        tried: set[bytes] = set()
        for H in candidates:
            Hn = np.asarray(H)  # stored prompts are uint32; comparisons span dtypes
            ident = Hn.tobytes()
            if ident in tried or not np.array_equal(Hn[:keep_prefix], copier.Pn[:keep_prefix]):
                continue
            tried.add(ident)
            pieces = copier.copy(Hn, keep_prefix)
            copied = sum(e - s for s, e in pieces)
            score = (copied // chunk_size, copied, -len(pieces))
            if best is None or score > best[0]:
                best = (score, pieces, Hn)
    except PlanBudgetExceeded:
        logger.debug("reorder planning ran out of time; keeping the best finished copy")
    if copier is None or best is None or best[0][0] <= baseline_chunks:
        return None
    order = _order_from(copier.Pn, best[2], best[1])
    return None if order == list(range(len(order))) else order


NS = tuple[str, int, str]
"""A prompt namespace: ``(model_name, world_size, cache_salt)``."""


class _Prompt:
    __slots__ = ("hashes", "ids", "seq")

    def __init__(self, seq: int, ids: np.ndarray) -> None:
        self.seq = seq  # order of first recording: larger is newer
        self.ids = ids
        self.hashes: set[bytes] = set()


class PromptStore:
    """The token ids of recently stored prompts, per namespace.

    Bounded by the total number of tokens held (least recently recorded prompts go
    first, but the last one always stays). For each namespace and chunk chain hash it
    remembers the newest prompt that stored that chunk, so a new prompt's fingerprint
    hits vote for the prompts it most likely shares documents with. Thread-safe.
    """

    def __init__(self, max_tokens: int = 1 << 24) -> None:
        self._lock = threading.Lock()
        self._max_tokens = max_tokens
        self._tokens = 0
        self._seq = 0
        self._prompts: OrderedDict[tuple[NS, str], _Prompt] = OrderedDict()
        self._owner: dict[tuple[NS, bytes], tuple[NS, str]] = {}
        # cache_salt -> (model_name, world_size) -> [prompts held, newest (ns, request_id)];
        # the salt is the outer key because lookups must match it exactly.
        self._ns: dict[str, dict[tuple[str, int], list[Any]]] = {}

    def record(
        self,
        ns: NS,
        request_id: str,
        token_ids: Sequence[int],
        chain_hashes: Sequence[bytes],
    ) -> None:
        """Note a store that committed KV for ``request_id``.

        The first call for a request keeps ``token_ids`` as its prompt (later calls may
        include decoded tokens, which are ignored); ``chain_hashes`` are chunk chain
        hashes of the request (from chunk 0 on), added to what it owns.
        """
        key = (ns, request_id)
        with self._lock:
            prompt = self._prompts.get(key)
            if prompt is None:
                self._seq += 1
                prompt = _Prompt(self._seq, np.asarray(token_ids, dtype=np.uint32))
                self._prompts[key] = prompt
                self._tokens += len(prompt.ids)
                slot = self._ns.setdefault(ns[2], {}).setdefault((ns[0], ns[1]), [0, key])
                slot[0] += 1
                slot[1] = key
            else:
                self._prompts.move_to_end(key)
            for h in chain_hashes:
                prompt.hashes.add(h)
                self._owner[(ns, h)] = key
            while self._tokens > self._max_tokens and len(self._prompts) > 1:
                self._evict_oldest()

    def _evict_oldest(self) -> None:
        (ns, rid), prompt = self._prompts.popitem(last=False)
        self._tokens -= len(prompt.ids)
        for h in prompt.hashes:
            if self._owner.get((ns, h)) == (ns, rid):
                del self._owner[(ns, h)]
        by_name = self._ns[ns[2]]
        slot = by_name[(ns[0], ns[1])]
        slot[0] -= 1
        if slot[0] == 0:
            del by_name[(ns[0], ns[1])]
            if not by_name:
                del self._ns[ns[2]]

    def resolve(self, model_name: str, world_size: int, cache_salt: str) -> NS | None:
        """The single recorded namespace matching the caller, else None. The salt must be
        equal; an empty ``model_name`` or a zero ``world_size`` matches any."""
        with self._lock:
            names = [
                (m, w)
                for m, w in self._ns.get(cache_salt, {})
                if (not model_name or m == model_name) and (not world_size or w == world_size)
            ]
        if len(names) != 1:
            return None
        return (names[0][0], names[0][1], cache_salt)

    def candidates(
        self,
        ns: NS,
        hit_hashes: Sequence[bytes],
        prompt_chain: Sequence[bytes],
        top_k: int = 4,
    ) -> tuple[list[np.ndarray], int]:
        """Prompts worth planning ``P`` against, newest first, and ``P``'s baseline.

        The prompts are the ``top_k`` owning most of ``hit_hashes`` (ties: newest), the
        one owning the last chunk of ``P``'s own cached prefix, and the namespace's
        newest (its fingerprints may not have arrived yet). The baseline is the number of
        leading ``prompt_chain`` hashes that some prompt of ``ns`` owns.
        """
        with self._lock:
            votes = Counter(self._owner[(ns, h)] for h in hit_hashes if (ns, h) in self._owner)
            ranked = sorted(votes, key=lambda k: (-votes[k], -self._prompts[k].seq))
            chosen = set(ranked[:top_k])
            base = 0
            for h in prompt_chain:
                if (ns, h) not in self._owner:
                    break
                base += 1
            if base:
                chosen.add(self._owner[(ns, prompt_chain[base - 1])])
            slot = self._ns.get(ns[2], {}).get((ns[0], ns[1]))
            if slot is not None and slot[1] in self._prompts:
                chosen.add(slot[1])
            picked = sorted((self._prompts[k] for k in chosen), key=lambda p: -p.seq)
            return [p.ids for p in picked], base
