"""``HostSimShmWrapper``: a hostsim KV tensor shared through core's POSIX-SHM machinery.

It reuses the public ``lmcache.v1.platform.cpu.shm`` wrapper for the mapping but travels
under its own wire kind (``hostsim_shm``, inside core's ``PluginIPCData``) and declares
device type ``hostsim``, so the server dispatches it to the hostsim backend.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from lmcache.v1.platform.base.ipc_wire import CpuShmIPCData, PluginIPCData
from lmcache.v1.platform.base.ipc_wrapper import register_ipc_wrapper
from lmcache.v1.platform.cpu.shm import CpuShmTensorWrapper

WIRE_KIND = "hostsim_shm"


class HostSimShmPayload(msgspec.Struct, forbid_unknown_fields=True):
    shm_name: str
    nbytes: int


@register_ipc_wrapper(WIRE_KIND)
class HostSimShmWrapper(CpuShmTensorWrapper):
    device_type: ClassVar[str] = "hostsim"

    def to_wire(self) -> PluginIPCData:  # type: ignore[override]
        payload = HostSimShmPayload(shm_name=self.shm_name, nbytes=self.segment_nbytes)
        return PluginIPCData(
            kind=WIRE_KIND, metadata=self.wire_metadata(), payload=msgspec.msgpack.encode(payload)
        )

    @classmethod
    def from_wire(cls, data: Any) -> HostSimShmWrapper:
        if not isinstance(data, PluginIPCData) or data.kind != WIRE_KIND:
            raise ValueError(f"expected PluginIPCData of kind {WIRE_KIND!r}, got {data!r}")
        try:
            payload = msgspec.msgpack.decode(data.payload, type=HostSimShmPayload)
        except msgspec.DecodeError as exc:
            raise ValueError(f"malformed {WIRE_KIND} payload: {exc}") from None
        shm = CpuShmIPCData(
            metadata=data.metadata, shm_name=payload.shm_name, nbytes=payload.nbytes
        )
        wrapper = super().from_wire(shm)
        assert isinstance(wrapper, HostSimShmWrapper)
        return wrapper
