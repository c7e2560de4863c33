"""The pieces every L2 serde is made of, and upstream's per-object interfaces.

A serde turns a KV chunk into the bytes an L2 tier stores, and back.  It is built from
*stages*, applied in order on the way to L2 and in reverse on the way back:

* at most one :class:`TensorStage`, first: reads the chunk's tensors and writes bytes
  (the quantizers, ``fp8`` and ``asym_k16_v8``, lossy);
* any number of :class:`ByteStage` s after it: bytes to bytes (``aesgcm``, lossless).

:class:`Serializer` / :class:`Deserializer` are upstream LMCache 0.5.6's per-object
interfaces (one source object, one destination buffer, the object's key); the built-in
serdes offer them too, so code written against upstream's names runs unchanged.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import torch

from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.storage_backend.cache_salt import salt_of


class SerdeError(ValueError):
    """Bytes this serde cannot decode (another or no serde wrote them, they were altered,
    or the key is wrong), or a chunk it cannot encode.  A tier treats it as a miss."""


@dataclass
class SerdeConfig:
    """One ``"serde"`` object of an ``--l2-adapter``: its ``type`` and the other fields.

    Attributes:
        type: a registered serde type (``fp8``, ``asym_k16_v8``, ``aesgcm``, ``multi``).
        kwargs: the type's own fields (everything but ``type``).
    """

    type: str
    kwargs: dict[str, Any] = field(default_factory=dict)


class TensorStage(abc.ABC):
    """KV tensors to bytes and back (a quantizer).  Lossy stages say so in ``lossless``."""

    lossless: bool = False

    @property
    @abc.abstractmethod
    def spec(self) -> str:
        """What this stage writes, with every parameter that changes the bytes (e.g.
        ``"fp8:float8_e4m3fn"``): stored chunks carry it, a reader with another spec
        refuses them."""

    @abc.abstractmethod
    def encode(self, parts: list[torch.Tensor], fmt: MemoryFormat) -> torch.Tensor:
        """The bytes (a flat uint8 CPU tensor) standing for ``parts``, the chunk's tensors
        (one per part of a multi-tensor object) in layout ``fmt``."""

    @abc.abstractmethod
    def decode(self, payload: torch.Tensor, out: list[torch.Tensor], fmt: MemoryFormat) -> None:
        """Write the tensors ``payload`` (flat uint8) stands for into ``out``; raises
        :class:`SerdeError` when ``payload`` does not fit ``out``."""

    @abc.abstractmethod
    def encoded_size(self, shapes: list[torch.Size], dtypes: list[torch.dtype]) -> int:
        """Bytes :meth:`encode` writes for tensors of these shapes and dtypes."""


class ByteStage(abc.ABC):
    """Bytes to bytes and back; ``salt`` is the chunk's tenant (``cache_salt``), ``aad``
    bytes the stage must bind the output to (a reader with other ``aad`` fails)."""

    lossless: bool = True

    @property
    @abc.abstractmethod
    def spec(self) -> str:
        """As :attr:`TensorStage.spec`."""

    @property
    @abc.abstractmethod
    def overhead(self) -> int:
        """Bytes :meth:`encode` adds to its input."""

    @abc.abstractmethod
    def encode(self, data: bytes | memoryview, salt: str, aad: bytes) -> bytes: ...

    @abc.abstractmethod
    def decode(self, data: bytes | memoryview, salt: str, aad: bytes) -> bytes:
        """The input of :meth:`encode`; :class:`SerdeError` when ``data`` is not an output
        of it for this ``salt`` and ``aad`` (altered, or another key)."""


# -- upstream's per-object interfaces ----------------------------------------------------------


class Serializer(abc.ABC):
    """Upstream's serializer: ``src`` (a KV object) into the byte buffer ``dst``."""

    @abc.abstractmethod
    def serialize(self, src: Any, dst: Any, key: Any) -> int:
        """Write ``src`` into ``dst``; the number of bytes written.  ``key`` selects
        per-tenant state (its ``cache_salt``); content-agnostic serdes ignore it."""

    @abc.abstractmethod
    def estimate_serialized_size(self, layout_desc: Any) -> int:
        """An upper bound of :meth:`serialize`'s output for ``layout_desc`` (its
        ``shapes`` and ``dtypes``)."""


class Deserializer(abc.ABC):
    """Upstream's deserializer: the byte buffer ``src`` into the KV object ``dst``."""

    @abc.abstractmethod
    def deserialize(self, src: Any, dst: Any, key: Any) -> None: ...


def key_salt(key: Any) -> str:
    """The ``cache_salt`` of a storage key (ours carry it as a request config) or of an
    upstream-style key (a ``cache_salt`` attribute)."""
    if getattr(key, "request_configs", None) is not None:
        return salt_of(key)
    return str(getattr(key, "cache_salt", "") or "")


def byte_tensor(data: bytes | bytearray | memoryview) -> torch.Tensor:
    """A fresh flat uint8 tensor holding ``data`` (empty data included, which
    ``torch.frombuffer`` refuses); fresh, so wider dtypes can view it aligned."""
    if len(data) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def layout_numel(shapes: Any) -> list[int]:
    """Element count of each shape."""
    counts = []
    for shape in shapes:
        n = 1
        for dim in shape:
            n *= int(dim)
        counts.append(n)
    return counts
