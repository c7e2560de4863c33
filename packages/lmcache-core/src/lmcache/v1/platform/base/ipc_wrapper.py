"""``DeviceIPCWrapper``: a device tensor made shareable with the cache server process.

Concrete wrappers register under a wire tag (see :mod:`.ipc_wire`); ``Serialize`` and
``Deserialize`` only accept registered wrappers, so nothing arbitrary is ever decoded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import msgspec
import torch

from lmcache.v1.platform.base.ipc_wire import (
    IPCData,
    NpuIPCData,
    PluginIPCData,
    TensorMetadata,
    WireIPCData,
)
from lmcache.v1.platform.dtype_names import dtype_to_str, str_to_dtype

logger = logging.getLogger(__name__)

_WRAPPER_TYPES: dict[str, type[DeviceIPCWrapper]] = {}
_WRAPPER_TYPES_LOCK = threading.Lock()


WrapperT = TypeVar("WrapperT", bound="DeviceIPCWrapper")


def register_ipc_wrapper(tag: str) -> Callable[[type[WrapperT]], type[WrapperT]]:
    """Class decorator: allow ``cls`` on the wire under ``tag``."""

    def decorate(cls: type[WrapperT]) -> type[WrapperT]:
        with _WRAPPER_TYPES_LOCK:
            existing = _WRAPPER_TYPES.get(tag)
            if existing is not None and existing is not cls:
                raise ValueError(
                    f"IPC wrapper tag {tag!r} already registered by {existing.__qualname__}"
                )
            _WRAPPER_TYPES[tag] = cls
        cls.wire_tag = tag
        return cls

    return decorate


def registered_ipc_wrappers() -> dict[str, type[DeviceIPCWrapper]]:
    with _WRAPPER_TYPES_LOCK:
        return dict(_WRAPPER_TYPES)


# Set by :mod:`lmcache.v1.platform.registry` when it is imported (always before any
# ``Deserialize``: the platform package imports the registry). Injected rather than imported
# so that ``base`` stays a leaf that never imports the registry built on top of it.
_backend_wrapper_importers: list[Callable[[], None]] = []


def set_backend_wrapper_importer(importer: Callable[[], None]) -> None:
    """Install the hook that imports every registered backend's wrapper class (idempotent)."""
    with _WRAPPER_TYPES_LOCK:
        _backend_wrapper_importers[:] = [importer]


def _import_backend_wrappers() -> None:
    """Import the ``ipc_wrapper_cls`` of every registered device backend."""
    with _WRAPPER_TYPES_LOCK:
        importers = list(_backend_wrapper_importers)
    for importer in importers:
        importer()


class DeviceIPCWrapper:
    """Base wrapper: tensor metadata plus a device-specific ``handle``."""

    wire_tag: ClassVar[str] = ""
    device_type: ClassVar[str] = ""

    def __init__(
        self,
        handle: Any,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        stride: tuple[int, ...],
        storage_offset: int = 0,
        device_uuid: str = "",
    ) -> None:
        self.handle = handle
        self.dtype = dtype
        self.shape = tuple(shape)
        self.stride = tuple(stride)
        self.storage_offset = storage_offset
        self.device_uuid = device_uuid

    @classmethod
    def wrap(cls, tensor: torch.Tensor) -> DeviceIPCWrapper:
        raise NotImplementedError(f"{cls.__name__} does not implement wrap()")

    def to_tensor(self) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not implement to_tensor()")

    def close(self) -> None:
        """Release resources held for the mapped tensor (called at cache-context teardown)."""

    def wire_metadata(self) -> TensorMetadata:
        return TensorMetadata(
            dtype=dtype_to_str(self.dtype),
            shape=self.shape,
            stride=self.stride,
            storage_offset=self.storage_offset,
            device_uuid=self.device_uuid,
        )

    def restore_metadata(self, metadata: TensorMetadata) -> None:
        self.dtype = str_to_dtype(metadata.dtype)
        self.shape = tuple(metadata.shape)
        self.stride = tuple(metadata.stride)
        self.storage_offset = metadata.storage_offset
        self.device_uuid = metadata.device_uuid

    def to_wire(self) -> IPCData | NpuIPCData:
        raise NotImplementedError(f"{type(self).__name__} does not implement to_wire()")

    @classmethod
    def from_wire(cls, data: Any) -> DeviceIPCWrapper:
        raise NotImplementedError(f"{cls.__name__} does not implement from_wire()")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, DeviceIPCWrapper)
        return (
            self.handle == other.handle
            and self.dtype == other.dtype
            and self.shape == other.shape
            and self.stride == other.stride
            and self.storage_offset == other.storage_offset
            and self.device_uuid == other.device_uuid
        )

    __hash__ = None  # type: ignore[assignment]

    @staticmethod
    def Serialize(obj: DeviceIPCWrapper) -> bytes:  # upstream name
        registered = registered_ipc_wrappers().get(type(obj).wire_tag)
        if registered is not type(obj):
            raise ValueError(f"Unsupported IPC wrapper type {type(obj).__qualname__}")
        return msgspec.msgpack.encode(obj.to_wire())

    @staticmethod
    def Deserialize(data: bytes) -> DeviceIPCWrapper:  # upstream name
        try:
            wire = msgspec.msgpack.decode(data, type=WireIPCData)
        except msgspec.DecodeError as exc:
            # Legacy upstream clients may send pickled wrappers; refusing them is deliberate.
            raise ValueError(
                f"malformed or unsupported DeviceIPCWrapper payload ({exc}); pickled "
                "wrappers are refused"
            ) from exc
        tag = str(type(wire).__struct_config__.tag)
        if isinstance(wire, PluginIPCData):
            tag = wire.kind
        wrapper_cls = registered_ipc_wrappers().get(tag)
        if wrapper_cls is None:
            # Wrapper classes register on import, which plugins keep lazy; pull in every
            # registered backend's wrapper once before refusing the tag.
            _import_backend_wrappers()
            wrapper_cls = registered_ipc_wrappers().get(tag)
        if wrapper_cls is None:
            raise ValueError(
                f"IPC wrapper kind {tag!r} is not supported by this server "
                f"(supported: {sorted(registered_ipc_wrappers())})"
            )
        return wrapper_cls.from_wire(wire)
