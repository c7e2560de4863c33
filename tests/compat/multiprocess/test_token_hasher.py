"""Our upstream-compatible ``TokenHasher`` (its equality with upstream's real hashes is
checked in tests_interop/test_token_hasher_matches_upstream.py)."""

from __future__ import annotations

import builtins
import hashlib
import importlib.util
from typing import Any

import numpy as np
import pytest

from lmcache.compat.upstream_056.token_hasher import (
    TokenHasher,
    cbor_canonical,
    chunk_hash_windows_numba,
    rolling_hash_windows_numba,
    update_table_id_numba,
)
from lmcache.v1.multiprocess import token_hasher

HAS_BLAKE3 = importlib.util.find_spec("blake3") is not None


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def refuse_vllm(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("vllm hidden by the test")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse_vllm)


# RFC 8949 appendix A examples (canonical / preferred serialisation).
@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (23, "17"),
        (24, "1818"),
        (100, "1864"),
        (1000, "1903e8"),
        (1000000, "1a000f4240"),
        (1000000000000, "1b000000e8d4a51000"),
        (18446744073709551615, "1bffffffffffffffff"),
        (-1, "20"),
        (-1000, "3903e7"),
        (None, "f6"),
        (True, "f5"),
        (b"\x01\x02\x03\x04", "4401020304"),
        ("IETF", "6449455446"),
        ((1, (2, 3), [4, 5]), "8301820203820405"),
        (tuple(range(1, 26)), "98190102030405060708090a0b0c0d0e0f101112131415161718181819"),
    ],
)
def test_cbor_matches_rfc8949_examples(value: Any, encoded: str) -> None:
    assert cbor_canonical(value).hex() == encoded


def test_cbor_refuses_what_it_cannot_encode_canonically() -> None:
    with pytest.raises(ValueError, match="64-bit"):
        cbor_canonical(2**64)
    with pytest.raises(TypeError, match="float"):
        cbor_canonical(1.5)


def test_sha256_cbor_without_vllm_chains_on_vllms_seed(
    no_vllm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    hasher = TokenHasher(chunk_size=4, hash_algorithm="sha256_cbor")
    seed_hash = hashlib.sha256(cbor_canonical("vllm-none-hash")).digest()
    assert hasher.none_hash == seed_hash
    first = hashlib.sha256(cbor_canonical((seed_hash, (1, 2, 3, 4), None))).digest()
    assert hasher.compute_chunk_hashes([1, 2, 3, 4, 5]) == [first]
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    reseeded = TokenHasher(chunk_size=4, hash_algorithm="sha256_cbor")
    assert reseeded.none_hash == hashlib.sha256(cbor_canonical("7")).digest()


def test_compute_chunk_hashes_windows_and_partial_chunks(no_vllm: None) -> None:
    hasher = TokenHasher(chunk_size=4, hash_algorithm="sha256_cbor")
    tokens = list(range(18))
    full = hasher.compute_chunk_hashes(tokens)
    assert len(full) == 4  # the two trailing tokens are dropped
    assert hasher.compute_chunk_hashes(tokens, start=4, end=12) == full[1:3]
    assert hasher.compute_chunk_hashes(tokens[:3]) == []
    # Rolling: a chunk's key depends on everything before it.
    assert hasher.compute_chunk_hashes([9, 9, 9, 9, *tokens[4:8]])[1] != full[1]


def test_hash_to_bytes() -> None:
    assert TokenHasher.hash_to_bytes(b"abc") == b"abc"
    assert TokenHasher.hash_to_bytes(-1) == b"\xff" * 8
    assert TokenHasher.hash_to_bytes(1) == b"\x00" * 7 + b"\x01"


def test_builtin_hash_is_pythons_hash() -> None:
    hasher = TokenHasher(chunk_size=2, hash_algorithm="builtin")
    assert hasher.hash_tokens([1, 2], prefix_hash=5) == hash((5, (1, 2), None))


def test_unknown_algorithm_is_refused(no_vllm: None) -> None:
    with pytest.raises(ValueError, match="unknown hash algorithm 'md5'"):
        TokenHasher(hash_algorithm="md5")
    with pytest.raises(ValueError, match="chunk_size"):
        TokenHasher(chunk_size=0, hash_algorithm="builtin")


@pytest.mark.skipif(HAS_BLAKE3, reason="blake3 is installed")
def test_blake3_missing_names_the_package() -> None:
    with pytest.raises(ImportError, match="pip install blake3"):
        TokenHasher(hash_algorithm="blake3")


@pytest.mark.skipif(not HAS_BLAKE3, reason="needs the blake3 package")
def test_blake3_packs_big_endian_uint32_tokens() -> None:
    import blake3

    hasher = TokenHasher(chunk_size=2, hash_algorithm="blake3")
    expected_none = blake3.blake3(b"\x00" * 8 + b"\x00\x00\x00\x00").digest()
    assert hasher.none_hash == expected_none
    chunk = blake3.blake3(expected_none + b"\x00\x00\x00\x01\xff\xff\xff\xff").digest()
    assert hasher.compute_chunk_hashes([1, 2**32 - 1]) == [chunk]


def test_rolling_and_chunk_window_hashes() -> None:
    base = np.uint64(31)
    arr = np.array([1, 2, 3, 4, 5], dtype=np.uint64)
    # 1*31^2 + 2*31 + 3 = 1026, then 2019, 3012.
    np.testing.assert_array_equal(rolling_hash_windows_numba(arr, 3, base), [1026, 2019, 3012])
    np.testing.assert_array_equal(chunk_hash_windows_numba(arr, 2, base), [33, 97])
    assert chunk_hash_windows_numba(arr, 6, base).shape == (0,)
    with pytest.raises(ValueError, match="window size"):
        rolling_hash_windows_numba(arr, 6, base)


def test_window_hashes_wrap_modulo_2_64() -> None:
    values = [2**63 + 5, 2**64 - 1, 7]
    base = 2**61 - 1
    expected = 0
    for v in values:
        expected = (expected * base + v) % 2**64
    arr = np.array(values, dtype=np.uint64)
    assert int(rolling_hash_windows_numba(arr, 3, np.uint64(base))[0]) == expected


def test_update_table_last_write_wins() -> None:
    table = np.full(8, -1, dtype=np.int64)
    hashes = np.array([1, 9, 2, 17], dtype=np.uint64)  # 1, 9 and 17 share slot 1
    update_table_id_numba(hashes, table, np.array([10, 11, 12, 13], dtype=np.int64))
    assert table.tolist() == [-1, 13, 12, -1, -1, -1, -1, -1]
    with pytest.raises(ValueError, match="power of two"):
        update_table_id_numba(hashes, np.zeros(6, dtype=np.int64), np.zeros(4, dtype=np.int64))


def test_module_keeps_upstreams_public_names() -> None:
    for name in ("TokenHasher", "_make_blake3_hash_func", "rolling_hash_windows_numba",
                 "chunk_hash_windows_numba", "update_table_id_numba"):  # fmt: skip
        assert hasattr(token_hasher, name), name
