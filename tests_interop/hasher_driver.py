"""Prints the chunk hashes upstream's ``TokenHasher`` and ours compute, as one JSON
result line.  Runs inside an upstream venv: ``theirs`` is the installed upstream
``lmcache.v1.multiprocess.token_hasher``; ``ours`` is our ``token_hasher.py`` (in
``lmcache/compat/upstream_056/``) loaded from the file given by ``--ours`` under another
module name (it needs only the standard
library, NumPy and, as upstream's, ``blake3`` / vLLM), so both run in one process and
vLLM is imported once."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from types import ModuleType
from typing import Any

CHUNK_SIZE = 64
# Token lists: exact chunks, a partial tail, large ids (up to the uint32 limit).
TOKEN_LISTS = {
    "exact": list(range(256)),
    "partial_tail": list(range(1000, 1000 + 200)),
    "large_ids": [151_000 + (i * 7919) % 100_000 for i in range(192)] + [2**32 - 1] * 64,
}


def _load_ours(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("ours_token_hasher", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _set_seed(seed: str | None) -> None:
    # vLLM reads PYTHONHASHSEED when the hasher derives its NONE_HASH, not at start-up.
    if seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = seed


def hashes(module: Any, algorithm: str) -> dict[str, Any]:
    hasher = module.TokenHasher(chunk_size=CHUNK_SIZE, hash_algorithm=algorithm)
    to_bytes = module.TokenHasher.hash_to_bytes
    out: dict[str, Any] = {"none_hash": to_bytes(hasher.none_hash).hex()}
    for name, tokens in TOKEN_LISTS.items():
        out[name] = [h.hex() for h in hasher.compute_chunk_hashes(tokens)]
    tokens = TOKEN_LISTS["exact"]
    out["window_64_192"] = [h.hex() for h in hasher.compute_chunk_hashes(tokens, start=64, end=192)]
    out["int_prefix"] = to_bytes(hasher.hash_tokens(tokens[:CHUNK_SIZE], prefix_hash=12345)).hex()
    return out


def _guarded(module: Any, algorithm: str) -> dict[str, Any]:
    try:
        return hashes(module, algorithm)
    except Exception as exc:  # reported to the test, not raised
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ours", required=True, help="path of our token_hasher.py")
    parser.add_argument("--algorithm", action="append", required=True)
    parser.add_argument("--seed", action="append", default=[], help="'unset' or a value")
    args = parser.parse_args()
    import lmcache
    from lmcache.v1.multiprocess import token_hasher as theirs

    ours = _load_ours(args.ours)
    result: dict[str, Any] = {"theirs_file": lmcache.__file__, "theirs": {}, "ours": {}}
    for algorithm in args.algorithm:
        for seed in args.seed or ["unset"]:
            _set_seed(None if seed == "unset" else seed)
            label = f"{algorithm}/{seed}"
            result["theirs"][label] = _guarded(theirs, algorithm)
            result["ours"][label] = _guarded(ours, algorithm)
    sys.stdout.write("INTEROP-RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # vLLM / upstream may leave threads behind; the result is out


if __name__ == "__main__":
    raise SystemExit(main())
