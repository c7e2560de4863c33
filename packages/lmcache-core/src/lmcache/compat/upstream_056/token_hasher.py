"""Upstream LMCache 0.5.6's ``TokenHasher``: rolling chunk hashes of token ids.

Upstream's multiprocess server names chunks by these hashes (``--hash-algorithm``);
this module gives code written against upstream the same names, signatures and hash
values, so it can compute upstream's chunk keys (e.g. for its L2 storage or its HTTP
cache API) without upstream installed.  Our own server names chunks by
:func:`lmcache.utils.chunk_hashes` instead; see docs/compatibility.md.

Algorithms:

* ``blake3`` (upstream's default): ``blake3(prefix || big-endian uint32 tokens)``, 32
  bytes; the chain starts from the hash of ``(0, (0,), None)``.  Needs the ``blake3``
  package (the one upstream uses).
* ``sha256_cbor`` (vLLM's): SHA-256 of the canonical CBOR encoding of
  ``(prefix, tokens, None)``.  With vLLM installed its own function and ``NONE_HASH``
  are used, exactly as upstream does; without vLLM we encode CBOR ourselves (no
  dependency) and seed the chain as vLLM 0.32 does (``PYTHONHASHSEED``, else
  ``"vllm-none-hash"``).  Upstream instead falls back to ``builtin`` when vLLM is
  missing, silently; we keep the algorithm that was asked for.
* ``builtin``: Python's ``hash((prefix, tokens, None))``.  On Python < 3.12 ``hash(None)``
  is address-based, so these values differ between processes even with
  ``PYTHONHASHSEED`` set (upstream's too): use it only inside one process.
* Any other name is looked up in vLLM (``get_hash_fn_by_name``) when it is installed;
  an unknown name raises ``ValueError`` (upstream falls back to ``builtin``).

``rolling_hash_windows_numba``, ``chunk_hash_windows_numba`` and
``update_table_id_numba`` keep upstream's names (its CacheBlend matcher imports them)
but are NumPy, not numba: same uint64 wrap-around arithmetic, same results.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

HashFunc = Callable[[Any], Any]

SUPPORTED_HASH_ALGORITHMS = ("blake3", "sha256_cbor", "builtin")
# vLLM renamed sha256_cbor_64bit to sha256_cbor; both names mean the same function here.
_SHA256_CBOR_NAMES = ("sha256_cbor", "sha256_cbor_64bit")
# The seed vLLM (0.32) derives NONE_HASH from when PYTHONHASHSEED is unset.
VLLM_DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


# ---------------------------------------------------------------------------------------
# blake3
# ---------------------------------------------------------------------------------------


def _prefix_bytes(prefix_hash: Any) -> bytes:
    """How upstream's blake3 hash serialises the previous chunk's hash."""
    if isinstance(prefix_hash, bytes):
        return prefix_hash
    if isinstance(prefix_hash, int):
        return prefix_hash.to_bytes(8, byteorder="big", signed=True)
    return bytes(prefix_hash)


def _make_blake3_hash_func() -> HashFunc:
    """A blake3 hash over ``(prefix_hash, tokens, _)`` tuples (upstream's calling form)."""
    try:
        import blake3
    except ImportError as exc:
        raise ImportError(
            "hash algorithm 'blake3' needs the blake3 package (pip install blake3)"
        ) from exc

    def blake3_hash(args: tuple[Any, Sequence[int], Any]) -> bytes:
        prefix_hash, tokens, _extra = args
        hasher = blake3.blake3()
        hasher.update(_prefix_bytes(prefix_hash))
        # Token ids are unsigned 32-bit big-endian, as upstream packs them.
        hasher.update(struct.pack(f">{len(tokens)}I", *tokens))
        return bytes(hasher.digest())

    return blake3_hash


# ---------------------------------------------------------------------------------------
# sha256_cbor without cbor2: canonical CBOR for the few types a chunk hash input holds
# ---------------------------------------------------------------------------------------


def _cbor_head(major: int, value: int) -> bytes:
    """A CBOR item head with the shortest argument encoding (canonical form)."""
    if value < 24:
        return bytes([(major << 5) | value])
    for info, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if value < 1 << (8 * width):
            return bytes([(major << 5) | info]) + value.to_bytes(width, "big")
    raise ValueError(f"integer {value} does not fit CBOR's 64-bit argument")


def cbor_canonical(obj: Any) -> bytes:
    """Canonical CBOR of ints, bytes, str, None, bools and (nested) tuples/lists.

    Equal to ``cbor2.dumps(obj, canonical=True)`` for these types; anything else (or an
    integer beyond 64 bits, which cbor2 would write as a bignum) raises ``TypeError`` /
    ``ValueError``.
    """
    if obj is None:
        return b"\xf6"
    if obj is True:
        return b"\xf5"
    if obj is False:
        return b"\xf4"
    if isinstance(obj, int):
        return _cbor_head(0, obj) if obj >= 0 else _cbor_head(1, -1 - obj)
    if isinstance(obj, bytes | bytearray | memoryview):
        data = bytes(obj)
        return _cbor_head(2, len(data)) + data
    if isinstance(obj, str):
        data = obj.encode("utf-8")
        return _cbor_head(3, len(data)) + data
    if isinstance(obj, tuple | list):
        return _cbor_head(4, len(obj)) + b"".join(cbor_canonical(item) for item in obj)
    raise TypeError(f"cannot CBOR-encode a {type(obj).__name__} for a chunk hash")


def sha256_cbor(obj: Any) -> bytes:
    """vLLM's ``sha256_cbor``: SHA-256 of the canonical CBOR encoding."""
    return hashlib.sha256(cbor_canonical(obj)).digest()


# ---------------------------------------------------------------------------------------
# vLLM lookups (only for algorithms other than blake3, as upstream)
# ---------------------------------------------------------------------------------------


def _names_to_try(hash_algorithm: str) -> tuple[str, ...]:
    return _SHA256_CBOR_NAMES if hash_algorithm in _SHA256_CBOR_NAMES else (hash_algorithm,)


def _vllm_hash_func(hash_algorithm: str) -> HashFunc | None:
    """vLLM's function of that name, or None when vLLM (or the name) is missing."""
    for module_path in ("vllm.utils.hashing", "vllm.utils"):
        try:
            module = __import__(module_path, fromlist=["get_hash_fn_by_name"])
        except Exception:  # a broken vLLM install counts as no vLLM here
            continue
        get_by_name = getattr(module, "get_hash_fn_by_name", None)
        for name in _names_to_try(hash_algorithm):
            if get_by_name is not None:
                try:
                    found: HashFunc = get_by_name(name)
                    return found
                except ValueError:
                    continue
            direct = getattr(module, name, None)
            if callable(direct):
                return direct  # type: ignore[no-any-return]
    return None


def _vllm_none_hash(hash_func: HashFunc) -> Any | None:
    """vLLM's ``NONE_HASH`` for ``hash_func``, or None when vLLM cannot give one."""
    try:
        from vllm.v1.core import kv_cache_utils
    except (ImportError, AttributeError, ValueError, RuntimeError, AssertionError):
        # vLLM raises the last two on some non-CUDA platforms at import time.
        return None
    init_none_hash = getattr(kv_cache_utils, "init_none_hash", None)
    if init_none_hash is None:
        return None
    try:
        init_none_hash(hash_func)
    except (ValueError, RuntimeError, AssertionError):
        return None
    return kv_cache_utils.NONE_HASH


def _builtin_hash(args: Any) -> int:
    return hash(args)


# ---------------------------------------------------------------------------------------
# TokenHasher
# ---------------------------------------------------------------------------------------


class TokenHasher:
    """Rolling prefix hashes of token chunks (upstream LMCache 0.5.6's API).

    ``hash_tokens`` hashes one chunk chained on ``prefix_hash``;
    ``compute_chunk_hashes`` hashes every complete chunk of a token list and returns the
    chunk keys as ``bytes``.
    """

    def __init__(self, chunk_size: int = 256, hash_algorithm: str = "blake3") -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        self.chunk_size = chunk_size
        self.hash_algorithm_name = hash_algorithm
        self.hash_func: HashFunc = self._get_hash_func(hash_algorithm)
        self.none_hash: Any = self._init_none_hash()
        logger.debug("TokenHasher: chunk_size=%d, hash_algorithm=%s", chunk_size, hash_algorithm)

    def _get_hash_func(self, hash_algorithm: str) -> HashFunc:
        if hash_algorithm == "blake3":
            # Never imports vLLM (upstream's tests check that).
            return _make_blake3_hash_func()
        if hash_algorithm == "builtin":
            if os.getenv("PYTHONHASHSEED") is None:
                logger.warning(
                    "hash algorithm 'builtin' without PYTHONHASHSEED: chunk hashes differ "
                    "between processes"
                )
            return _builtin_hash
        from_vllm = _vllm_hash_func(hash_algorithm)
        if from_vllm is not None:
            return from_vllm
        if hash_algorithm in _SHA256_CBOR_NAMES:
            return sha256_cbor
        raise ValueError(
            f"unknown hash algorithm {hash_algorithm!r}: use one of "
            f"{', '.join(SUPPORTED_HASH_ALGORITHMS)} (or a vLLM hash function name with "
            "vLLM installed)"
        )

    def _try_get_hash(
        self, get_hash_fn_by_name: Callable[[str], HashFunc], hash_algorithm: str, module_name: str
    ) -> HashFunc:
        """``get_hash_fn_by_name`` under either sha256_cbor name; ValueError if neither."""
        for name in _names_to_try(hash_algorithm):
            try:
                return get_hash_fn_by_name(name)
            except ValueError:
                continue
        raise ValueError(f"Hash function '{hash_algorithm}' not found in {module_name}")

    def _init_none_hash(self) -> Any:
        """The hash the first chunk chains on.

        For algorithms other than blake3 vLLM's ``NONE_HASH`` wins when vLLM is importable
        (as upstream); otherwise sha256_cbor seeds like vLLM 0.32 and the rest hash
        ``(0, (0,), None)``.
        """
        if self.hash_algorithm_name != "blake3":
            from_vllm = _vllm_none_hash(self.hash_func)
            if from_vllm is not None:
                return from_vllm
            if self.hash_func is sha256_cbor:
                return sha256_cbor(os.getenv("PYTHONHASHSEED") or VLLM_DEFAULT_NONE_HASH_SEED)
        return self.hash_func((0, (0,), None))

    def hash_tokens(self, tokens: Sequence[int], prefix_hash: Any = None) -> Any:
        """Hash of one chunk chained on ``prefix_hash`` (``none_hash`` when None)."""
        if prefix_hash is None:
            prefix_hash = self.none_hash
        return self.hash_func((prefix_hash, tuple(tokens), None))

    def compute_chunk_hashes(
        self,
        token_ids: Sequence[int],
        prefix_hash: Any = None,
        start: int = 0,
        end: int | None = None,
    ) -> list[bytes]:
        """Keys (as bytes) of the complete chunks in ``[start, end)``.

        The chain always starts at token 0 (a chunk's hash covers its whole prefix);
        chunks before ``start`` are hashed but not returned, hashing stops at ``end`` and a
        trailing partial chunk is dropped.  ``start`` / ``end`` are token indices.
        """
        current = self.none_hash if prefix_hash is None else prefix_hash
        limit = len(token_ids) if end is None else min(len(token_ids), end)
        complete = limit - limit % self.chunk_size
        hashes: list[bytes] = []
        for begin in range(0, complete, self.chunk_size):
            current = self.hash_tokens(token_ids[begin : begin + self.chunk_size], current)
            if begin >= start:
                hashes.append(self.hash_to_bytes(current))
        return hashes

    @staticmethod
    def hash_to_bytes(hash_val: Any) -> bytes:
        """A chunk key as bytes: bytes unchanged, ints as 8 big-endian signed bytes."""
        if isinstance(hash_val, bytes):
            return hash_val
        return int(hash_val).to_bytes(8, byteorder="big", signed=True)


# ---------------------------------------------------------------------------------------
# Polynomial window hashes (upstream's numba kernels, here in NumPy)
# ---------------------------------------------------------------------------------------


def _powers_descending(k: int, base: Any) -> np.ndarray:
    """``[base^(k-1), ..., base, 1]`` in uint64 (wrapping mod 2^64)."""
    powers = np.ones(k, dtype=np.uint64)
    b = np.uint64(base)
    with np.errstate(over="ignore"):
        for i in range(k - 2, -1, -1):
            powers[i] = powers[i + 1] * b
    return powers


def _window_hashes(windows: np.ndarray, k: int, base: Any) -> np.ndarray:
    powers = _powers_descending(k, base)
    with np.errstate(over="ignore"):
        return (windows.astype(np.uint64, copy=False) * powers).sum(axis=1, dtype=np.uint64)


def rolling_hash_windows_numba(arr_u64: np.ndarray, k: int, base: Any) -> np.ndarray:
    """Polynomial hash of every window of ``k`` consecutive values (stride 1).

    ``H = x0*base^(k-1) + ... + x_{k-1}`` mod 2^64; ``len(arr) - k + 1`` values.
    """
    arr = np.ascontiguousarray(arr_u64, dtype=np.uint64)
    if k <= 0 or k > arr.shape[0]:
        raise ValueError(f"window size {k} does not fit an array of {arr.shape[0]} values")
    windows = np.lib.stride_tricks.sliding_window_view(arr, k)
    return _window_hashes(windows, k, base)


def chunk_hash_windows_numba(arr_u64: np.ndarray, k: int, base: Any) -> np.ndarray:
    """The same polynomial hash over non-overlapping windows; a partial tail is ignored."""
    if k <= 0:
        raise ValueError(f"window size must be positive, got {k}")
    arr = np.ascontiguousarray(arr_u64, dtype=np.uint64)
    num_windows = arr.shape[0] // k
    windows = arr[: num_windows * k].reshape(num_windows, k)
    return _window_hashes(windows, k, base)


def update_table_id_numba(
    hashes_u64: np.ndarray, table_id_i64: np.ndarray, vals_to_update: np.ndarray
) -> None:
    """``table[hash & (size - 1)] = value`` for each pair, in order (the last write wins).

    The table size must be a power of two (the mask is the index).
    """
    size = int(table_id_i64.shape[0])
    if size & (size - 1):
        raise ValueError(f"table size {size} is not a power of two")
    hashes = np.asarray(hashes_u64, dtype=np.uint64)
    values = np.asarray(vals_to_update)
    if hashes.shape[0] != values.shape[0]:
        raise ValueError(f"{hashes.shape[0]} hashes but {values.shape[0]} values")
    slots = (hashes & np.uint64(size - 1)).astype(np.int64)
    # NumPy does not order duplicate writes of a fancy assignment: keep each slot's last.
    reversed_slots = slots[::-1]
    _, first_in_reversed = np.unique(reversed_slots, return_index=True)
    keep = slots.shape[0] - 1 - first_in_reversed
    table_id_i64[slots[keep]] = values[keep]
