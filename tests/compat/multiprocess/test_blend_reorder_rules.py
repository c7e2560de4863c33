"""The CacheBlend reorder planner at upstream's ``modules.blend.reorder`` path: rules that
upstream's own tests leave implicit (separator bridging, the junction token, hash
collisions, degenerate prompts, the store's size bound)."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from lmcache.compat.upstream_056.modules.blend import reorder as br

C = 32
SYS = list(range(1, C + 1))
SEP = [7]
Q = [9] * br.LMIN


def _doc(seed: int, n: int = 40) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 50000) for _ in range(n)]


def _serve(P: list[int], cands: list[list[int]], baseline: int = 0) -> list[int]:
    perm = br.plan(P, cands, C, baseline, deadline=time.monotonic() + 5)
    if perm is None:
        return P
    assert sorted(perm) == list(range(len(P)))
    return [P[i] for i in perm]


def test_a_separator_is_bridged_between_pieces() -> None:
    a, b = _doc(1), _doc(2)
    P = SYS + b + SEP + a + Q
    H = SYS + a + SEP + b + [5] * 40
    served = _serve(P, [H])
    n = len(SYS) + len(a) + 1 + len(b)
    assert served[:n] == H[:n]  # [sys][a][sep][b]: the separator came from between b and a
    assert served[-len(Q) :] == Q


def test_the_junction_token_follows_the_copy() -> None:
    # H continues with a separator after the copied documents; P has one beside a cut.
    a, b, x = _doc(3), _doc(4), _doc(5)
    P = SYS + x + SEP + b + a + Q
    H = SYS + a + b + SEP + _doc(6)
    served = _serve(P, [H])
    n = len(SYS) + len(a) + len(b)
    assert served[: n + 1] == H[: n + 1]


def test_hash_collisions_do_not_change_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = _doc(7), _doc(8), _doc(9)
    P = SYS + c + SEP + b + SEP + a + Q
    H = SYS + a + SEP + b + SEP + _doc(10)
    want = br.plan(P, [H], C, 0, deadline=time.monotonic() + 5)
    assert want is not None
    monkeypatch.setattr(
        br, "_window_hashes", lambda t: np.zeros(max(len(t) - br.LMIN + 1, 0), np.uint64)
    )
    assert br.plan(P, [H], C, 0, deadline=time.monotonic() + 5) == want


def test_degenerate_prompts() -> None:
    assert br.plan([], [[1, 2, 3]], C, 0, deadline=time.monotonic() + 5) is None
    short = list(range(10))
    assert br.plan(short, [short[::-1]], 4, 0, deadline=time.monotonic() + 5) is None
    # a candidate shorter than the kept prefix is never used
    P = SYS + _doc(11) + Q
    assert br.plan(P, [SYS[:5]], C, 0, deadline=time.monotonic() + 5, keep_prefix=10) is None


def test_store_keeps_its_newest_prompt_even_over_budget() -> None:
    store = br.PromptStore(max_tokens=4)
    ns = ("m", 1, "")
    store.record(ns, "big", list(range(10)), [b"h"])
    cands, base = store.candidates(ns, [b"h"], [b"h"])
    assert [len(c) for c in cands] == [10] and base == 1
    assert cands[0].dtype == np.uint32
    store.record(ns, "next", [1], [b"g"])  # now the big one goes
    assert [list(c) for c in store.candidates(ns, [b"h", b"g"], [])[0]] == [[1]]
