"""A serde as a tier uses it: a stored chunk's bytes from a memory object, and back.

Stored form (little-endian)::

    magic b"LMSE" | version u8 (=1) | header_len u32 | header (UTF-8 JSON) | body

The header names the serde that wrote the body (its ``spec``, e.g.
``"fp8:float8_e4m3fn+aesgcm:256"``) and the chunk's layout (shapes, dtypes, memory
format, used size), so a reader allocates the right object and a reader configured with
another serde -- or none -- refuses the bytes instead of misreading them.  The body is the
tensor stage's output (the chunk's raw bytes without one), passed through the byte stages
in order.  Byte stages bind their output to the header and the chunk's key string
(``aad``), so neither can be swapped under an encrypted body.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lmcache.utils import CacheEngineKey, dtype_to_str, str_to_dtype
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.storage_backend.serde.base import (
    ByteStage,
    SerdeError,
    TensorStage,
    byte_tensor,
    key_salt,
)

MAGIC = b"LMSE"
VERSION = 1
_PREFIX = struct.Struct("<4sBI")
_MAX_HEADER = 1 << 16
SERDE_TAG = "serde"
"""Name of the key tag (``lmcache.tag.serde``) under which a tier with a serde stores
chunks: chunks of another serde, or of none, are other keys there -- a miss, not a
misread."""

Allocate = Callable[[list[torch.Size], list[torch.dtype], MemoryFormat], MemoryObj | None]


def _parts(obj: MemoryObj) -> list[torch.Tensor]:
    """The chunk's tensors: one per part, or the used bytes of a narrowed object as a flat
    tensor of its (single) dtype."""
    used = obj.metadata.used_size
    dtypes = obj.get_dtypes()
    if used is None:
        parts = [obj.get_tensor(i) for i in range(len(obj.get_shapes()))]
        if any(p is None for p in parts):
            raise SerdeError("serde: a memory object without tensors cannot be encoded")
        return [p for p in parts if p is not None]
    if len(set(dtypes)) != 1 or used % dtypes[0].itemsize:
        raise SerdeError("serde: a narrowed multi-dtype object cannot be encoded")
    raw = obj.raw_tensor
    if raw is None:
        raise SerdeError("serde: a memory object without tensors cannot be encoded")
    return [raw[:used].view(dtypes[0])]


class ChunkSerde:
    """The stages of one ``"serde"`` configuration, applied to whole chunks.

    ``tensor_stage`` (optional) comes first, then ``byte_stages`` in order; decoding runs
    them in reverse.
    """

    def __init__(
        self, tensor_stage: TensorStage | None = None, byte_stages: Sequence[ByteStage] = ()
    ) -> None:
        if tensor_stage is None and not byte_stages:
            raise ValueError("a serde needs at least one stage")
        self.tensor_stage = tensor_stage
        self.byte_stages = tuple(byte_stages)
        specs = [tensor_stage.spec] if tensor_stage is not None else []
        specs += [s.spec for s in self.byte_stages]
        self.spec = "+".join(specs)
        self.lossless = tensor_stage is None or tensor_stage.lossless

    @property
    def tag_value(self) -> str:
        """The spec as a key tag value (key strings use '@' and '%' as separators)."""
        return self.spec.replace(":", "-")

    def stored_key(self, key: CacheEngineKey) -> CacheEngineKey:
        """The key the tier stores ``key``'s chunk under (tagged with this serde)."""
        configs = dict(key.request_configs or {})
        configs["lmcache.tag." + SERDE_TAG] = self.tag_value
        return type(key)(**_key_fields(key, configs))

    def encoded_size(self, obj: MemoryObj) -> int:
        """Bytes of the body :meth:`encode` writes for ``obj`` (without the header)."""
        if self.tensor_stage is not None:
            size = self.tensor_stage.encoded_size(obj.get_shapes(), obj.get_dtypes())
        else:
            size = obj.get_size()
        return size + sum(s.overhead for s in self.byte_stages)

    def _header(self, obj: MemoryObj) -> bytes:
        header = {
            "serde": self.spec,
            "shapes": [list(s) for s in obj.get_shapes()],
            "dtypes": [dtype_to_str(d) for d in obj.get_dtypes()],
            "fmt": obj.get_memory_format().value,
            "used_size": obj.metadata.used_size,
        }
        return json.dumps(header, separators=(",", ":")).encode("utf-8")

    def encode(self, key: Any, obj: MemoryObj) -> bytearray:
        """The stored form of ``obj`` (the chunk of ``key``)."""
        header = self._header(obj)
        body: bytes | memoryview
        if self.tensor_stage is not None:
            encoded = self.tensor_stage.encode(_parts(obj), obj.get_memory_format())
            array: Any = encoded.numpy()
            body = memoryview(array).cast("B")
        else:
            body = obj.byte_array
        if self.byte_stages:
            aad = _aad(header, key)
            salt = key_salt(key)
            for stage in self.byte_stages:
                body = stage.encode(body, salt, aad)
        # One buffer, written once: the tier wraps it without another copy (blob_object).
        head = _PREFIX.pack(MAGIC, VERSION, len(header)) + header
        out = bytearray(len(head) + len(body))
        out[: len(head)] = head
        out[len(head) :] = body
        return out

    def decode(
        self, key: Any, blob: bytes | bytearray | memoryview, allocate: Allocate
    ) -> MemoryObj | None:
        """The chunk ``blob`` holds, in an object from ``allocate`` (None when it has no
        memory).  :class:`SerdeError` when ``blob`` was not written by this serde for
        ``key``: another serde or none, altered bytes, another key."""
        view = memoryview(blob).cast("B")
        header_raw, layout = self._read_header(view)
        body: bytes | memoryview = view[_PREFIX.size + len(header_raw) :]
        if self.byte_stages:
            aad = _aad(header_raw, key)
            salt = key_salt(key)
            for stage in reversed(self.byte_stages):
                body = stage.decode(body, salt, aad)
        shapes, dtypes, fmt, used = layout
        obj = allocate(shapes, dtypes, fmt)
        if obj is None:
            return None
        try:
            if used is not None:
                obj.set_used_size(used)
            self._fill(obj, body)
        except BaseException:
            obj.ref_count_down()
            raise
        return obj

    def _fill(self, obj: MemoryObj, body: bytes | memoryview) -> None:
        if self.tensor_stage is None:
            out = memoryview(obj.byte_array).cast("B")
            if len(out) != len(body):
                raise SerdeError(f"serde: body holds {len(body)} bytes, chunk needs {len(out)}")
            out[:] = body
            return
        # A fresh buffer: the tensor stage views it as wider dtypes, which needs alignment.
        payload = byte_tensor(body)
        self.tensor_stage.decode(payload, _parts(obj), obj.get_memory_format())

    def _read_header(
        self, view: memoryview
    ) -> tuple[bytes, tuple[list[torch.Size], list[torch.dtype], MemoryFormat, int | None]]:
        if len(view) < _PREFIX.size:
            raise SerdeError("serde: stored chunk too short for a serde header")
        magic, version, header_len = _PREFIX.unpack(view[: _PREFIX.size])
        if magic != MAGIC:
            raise SerdeError("serde: stored chunk was not written by a serde (bad magic)")
        if version != VERSION:
            raise SerdeError(f"serde: unsupported serde format version {version}")
        if header_len > _MAX_HEADER or _PREFIX.size + header_len > len(view):
            raise SerdeError("serde: truncated serde header")
        header_raw = bytes(view[_PREFIX.size : _PREFIX.size + header_len])
        try:
            header = json.loads(header_raw)
            written_by = header["serde"]
            layout = (
                [torch.Size(s) for s in header["shapes"]],
                [str_to_dtype(d) for d in header["dtypes"]],
                MemoryFormat(header["fmt"]),
                None if header.get("used_size") is None else int(header["used_size"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise SerdeError(f"serde: bad serde header: {exc}") from None
        if written_by != self.spec:
            raise SerdeError(
                f"serde: chunk written by serde {written_by!r}, this tier uses {self.spec!r}"
            )
        return header_raw, layout


def _aad(header: bytes, key: Any) -> bytes:
    name = key.to_string() if hasattr(key, "to_string") else repr(key)
    return header + b"\x00" + name.encode("utf-8")


def _key_fields(key: CacheEngineKey, configs: dict[str, Any]) -> dict[str, Any]:
    fields = {
        "model_name": key.model_name,
        "world_size": key.world_size,
        "worker_id": key.worker_id,
        "chunk_hash": key.chunk_hash,
        "dtype": key.dtype,
        "request_configs": configs,
    }
    layer = getattr(key, "layer_id", None)
    if layer is not None:
        fields["layer_id"] = layer
    return fields
