"""Wire descriptors for ``DeviceIPCWrapper`` (msgspec, tagged union, no pickle).

A wrapper travels as msgpack Ext code 1 holding one of these structs; the tag names the
wrapper kind (``cuda``, ``cuda_raw``, ``cuda_vmm``, ``cpu_shm``, ``musa``, ``npu``) so
decoding is an allowlist: unknown tags and unknown fields are rejected.  A wrapper of an
out-of-tree backend travels as :class:`PluginIPCData`: its ``kind`` must be a tag some
registered backend's wrapper claimed, and its ``payload`` is that wrapper's own msgpack.
"""

from __future__ import annotations

from typing import Literal

import msgspec

DEVICE_IPC_WRAPPER_EXT_CODE = 1


class TensorMetadata(msgspec.Struct, forbid_unknown_fields=True):
    dtype: str  # torch dtype name without the "torch." prefix
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    device_uuid: str


class IPCData(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag=True):
    version: Literal[1] = 1
    metadata: TensorMetadata


class CudaIPCData(IPCData, tag="cuda"):
    handle: tuple[int, bytes | None, int, int, bytes | None, int, bytes | None, bool]


class RawCudaIPCData(IPCData, tag="cuda_raw"):
    ipc_handle: bytes
    alloc_offset: int
    nbytes: int


class VmmCudaIPCData(IPCData, tag="cuda_vmm"):
    export_id: bytes
    kind: Literal["posix_fd", "fabric"]
    fabric_blob: bytes | None
    alloc_size: int
    alloc_offset: int
    nbytes: int


class CpuShmIPCData(IPCData, tag="cpu_shm"):
    shm_name: str
    nbytes: int


class MusaIPCData(IPCData, tag="musa"):
    handle: object


class NpuPlaneData(msgspec.Struct, forbid_unknown_fields=True):
    handle: tuple[object, ...]
    metadata: TensorMetadata


class NpuIPCData(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag="npu"):
    version: Literal[1] = 1
    bare: bool
    planes: tuple[NpuPlaneData, ...]


class PluginIPCData(IPCData, tag="plugin"):
    """A wrapper whose kind core does not know: decoded only by the wrapper registered under
    ``kind``, which decodes ``payload`` with its own typed ``msgspec`` struct (never pickle)."""

    kind: str
    payload: bytes


WireIPCData = (
    CudaIPCData
    | RawCudaIPCData
    | VmmCudaIPCData
    | CpuShmIPCData
    | MusaIPCData
    | NpuIPCData
    | PluginIPCData
)
