"""The chunk byte format shared by the disk tier (one file per chunk) and Redis (one value).

Layout (little-endian), version 2 (written)::

    magic  b"LMCD" | version u16 (=2) | checksum u16 | header_len u32 | payload_len u64
    payload_sum u64 | header_sum u64 | header (UTF-8 JSON) | payload

``checksum`` names the algorithm of both sums: 1 = CRC-32 (zero-extended), 2 = XXH3-64.
New chunks use XXH3-64 (``xxhash``, tens of GB/s per core, so verifying a read costs a
fraction of reading it); CRC-32 only when ``xxhash`` is not importable.  Version 1 (still
read) is the same without the algorithm: ``flags u16`` (0) in its place and
``payload_crc32 u32 | header_crc32 u32``.

The JSON header holds the key string, shapes, dtypes, memory format and used size.  A
chunk whose header, length or payload checksum does not match -- or whose checksum
algorithm this process cannot compute -- raises :class:`CorruptFileError`; the tiers treat
it as a miss and delete it.  Nothing is pickled.
"""

from __future__ import annotations

import io
import json
import logging
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

import torch

from lmcache.utils import CacheEngineKey, dtype_to_str, str_to_dtype
from lmcache.v1.memory.base import MemoryObj, MemoryObjMetadata
from lmcache.v1.memory.format import MemoryFormat, part_offsets
from lmcache.v1.memory.objects import TensorMemoryObj

if TYPE_CHECKING:
    from lmcache.v1.storage_backend.abstract_backend import AllocatorBackendInterface

logger = logging.getLogger(__name__)

MAGIC = b"LMCD"
FORMAT_VERSION = 2
"""The version written; :func:`read_header` also reads :data:`FORMAT_VERSION_CRC32`."""
FORMAT_VERSION_CRC32 = 1
_LEAD = struct.Struct("<4sHH")  # magic, version, checksum algorithm (v1: flags)
_REST_V1 = struct.Struct("<IQII")
_REST_V2 = struct.Struct("<IQQQ")
PREFIX_SIZE = _LEAD.size + _REST_V2.size
"""Bytes before the JSON header in the written format."""
_PREFIX_SIZES = {
    FORMAT_VERSION_CRC32: _LEAD.size + _REST_V1.size,
    FORMAT_VERSION: PREFIX_SIZE,
}
_MAX_HEADER = 1 << 20

CHECKSUM_CRC32 = 1
CHECKSUM_XXH3_64 = 2
CHECKSUM_NAMES = {CHECKSUM_CRC32: "CRC-32", CHECKSUM_XXH3_64: "XXH3-64"}


class CorruptFileError(Exception):
    """A stored chunk (cache file or Redis value) failed validation."""


def _crc32(data: Any) -> int:
    return zlib.crc32(data)


def _load_xxh3() -> Callable[[Any], int] | None:
    try:
        from xxhash import xxh3_64_intdigest
    except ImportError:
        logger.debug("xxhash is not installed: new cache objects are checksummed with CRC-32")
        return None
    return xxh3_64_intdigest


_CHECKSUM_FUNCS: dict[int, Callable[[Any], int]] = {CHECKSUM_CRC32: _crc32}
_xxh3 = _load_xxh3()
if _xxh3 is not None:
    _CHECKSUM_FUNCS[CHECKSUM_XXH3_64] = _xxh3
WRITE_CHECKSUM = CHECKSUM_XXH3_64 if _xxh3 is not None else CHECKSUM_CRC32
"""The algorithm of new objects: XXH3-64, or CRC-32 where ``xxhash`` is missing."""


def checksum(algorithm: int, data: Any) -> int:
    """``algorithm``'s digest of ``data`` (any buffer); CorruptFileError if unavailable."""
    func = _CHECKSUM_FUNCS.get(algorithm)
    if func is None:
        name = CHECKSUM_NAMES.get(algorithm, f"#{algorithm}")
        raise CorruptFileError(f"checksum algorithm {name} is not available here")
    return func(data)


class PayloadChecksum(NamedTuple):
    """The payload's recorded sum and its algorithm, from :func:`read_header`."""

    algorithm: int
    expected: int

    def verify(self, payload: Any) -> None:
        if checksum(self.algorithm, payload) != self.expected:
            raise CorruptFileError("payload checksum mismatch")


def encode_prefix(header: bytes, payload: Any, algorithm: int | None = None) -> bytes:
    """The prefix of an object (current format version) with sums of ``header``/``payload``."""
    algo = WRITE_CHECKSUM if algorithm is None else algorithm
    rest = _REST_V2.pack(len(header), len(payload), checksum(algo, payload), checksum(algo, header))
    return _LEAD.pack(MAGIC, FORMAT_VERSION, algo) + rest


def encode_header(key: CacheEngineKey, obj: MemoryObj) -> dict[str, Any]:
    meta = obj.metadata
    return {
        "key": key.to_string(),
        "shapes": [list(s) for s in obj.get_shapes()],
        "dtypes": [dtype_to_str(d) for d in obj.get_dtypes()],
        "fmt": obj.get_memory_format().value,
        "used_size": meta.used_size,
    }


def read_header(f: BinaryIO, file_size: int) -> tuple[dict[str, Any], int, PayloadChecksum]:
    """``(header, payload_len, payload_checksum)`` of a version 1 or 2 object; raises
    :class:`CorruptFileError`."""
    lead = f.read(_LEAD.size)
    if len(lead) != _LEAD.size:
        raise CorruptFileError("truncated prefix")
    magic, version, algorithm = _LEAD.unpack(lead)
    if magic != MAGIC:
        raise CorruptFileError("bad magic")
    if version == FORMAT_VERSION:
        rest_struct = _REST_V2
    elif version == FORMAT_VERSION_CRC32:
        rest_struct, algorithm = _REST_V1, CHECKSUM_CRC32  # v1: the field is flags
    else:
        raise CorruptFileError(f"unsupported format version {version}")
    rest = f.read(rest_struct.size)
    if len(rest) != rest_struct.size:
        raise CorruptFileError("truncated prefix")
    header_len, payload_len, payload_sum, header_sum = rest_struct.unpack(rest)
    if header_len > _MAX_HEADER:
        raise CorruptFileError("header too large")
    expected_size = _PREFIX_SIZES[version] + header_len + payload_len
    if file_size != expected_size:
        raise CorruptFileError(f"size {file_size} != expected {expected_size}")
    raw_header = f.read(header_len)
    if len(raw_header) != header_len or checksum(algorithm, raw_header) != header_sum:
        raise CorruptFileError("header checksum mismatch")
    try:
        header = json.loads(raw_header)
    except ValueError as exc:
        raise CorruptFileError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or "key" not in header:
        raise CorruptFileError("header without key")
    return header, payload_len, PayloadChecksum(algorithm, payload_sum)


# -- a whole chunk in one buffer (Redis values) ---------------------------------------------


def encode_parts(key: CacheEngineKey, obj: MemoryObj) -> tuple[bytes, memoryview]:
    """``(prefix + header, payload)`` of ``obj`` in the chunk format."""
    header = json.dumps(encode_header(key, obj)).encode("utf-8")
    payload = obj.byte_array
    return encode_prefix(header, payload) + header, payload


def encode_value(key: CacheEngineKey, obj: MemoryObj) -> bytes:
    """The encoded chunk of ``obj`` as one new buffer."""
    head, payload = encode_parts(key, obj)
    return b"".join((head, payload))


@dataclass
class DecodedValue:
    shapes: list[torch.Size]
    dtypes: list[torch.dtype]
    fmt: MemoryFormat
    used_size: int | None
    payload: memoryview


def decode_value(key: CacheEngineKey, value: bytes) -> DecodedValue:
    """Validate ``value`` as the encoded chunk of ``key``; raises :class:`CorruptFileError`."""
    header, payload_len, payload_sum = read_header(io.BytesIO(value), len(value))
    if header["key"] != key.to_string():
        raise CorruptFileError("key in header does not match")
    payload = memoryview(value)[len(value) - payload_len :]
    payload_sum.verify(payload)
    try:
        decoded = DecodedValue(
            shapes=[torch.Size(s) for s in header["shapes"]],
            dtypes=[str_to_dtype(d) for d in header["dtypes"]],
            fmt=MemoryFormat(header["fmt"]),
            used_size=header.get("used_size"),
            payload=payload,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptFileError(f"bad header: {exc}") from None
    expected = decoded.used_size
    if expected is None:
        expected = part_offsets(decoded.shapes, decoded.dtypes)[-1]
    if expected != payload_len:
        raise CorruptFileError("payload length does not match the header")
    return decoded


def allocate_for_read(
    local_cpu_backend: AllocatorBackendInterface | None,
    shapes: list[torch.Size],
    dtypes: list[torch.dtype],
    fmt: MemoryFormat,
) -> MemoryObj | None:
    """Memory for a chunk read back from a lower tier: from L1's allocator when there is
    one (None when it is full), else a standalone object."""
    if local_cpu_backend is not None:
        if len(shapes) == 1:
            return local_cpu_backend.allocate(shapes[0], dtypes[0], fmt)
        return local_cpu_backend.allocate(shapes, dtypes, fmt)
    nbytes = part_offsets(shapes, dtypes)[-1]
    multi = len(shapes) > 1
    meta = MemoryObjMetadata(
        shape=shapes[0],
        dtype=dtypes[0],
        address=0,
        phy_size=nbytes,
        ref_count=1,
        fmt=fmt,
        shapes=shapes if multi else None,
        dtypes=dtypes if multi else None,
    )
    return TensorMemoryObj(torch.empty(nbytes, dtype=torch.uint8), meta)
