"""``CudaIPCWrapper``: a worker's CUDA tensor shared with the cache server by IPC handle.

The handle is torch's ``UntypedStorage._share_cuda_()`` tuple (CUDA IPC memory handle plus
torch's reference-counter and event handles), which is exactly the ``CudaIPCData`` wire shape
(tag ``"cuda"``). The server rebuilds the storage with ``_new_shared_cuda`` -- the memory is
mapped, never copied -- and views it with the wrapped dtype, shape, stride and offset.

Devices are matched by UUID, not ordinal, because the worker and the server may see the
GPUs in a different order (``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from lmcache.v1.platform.base.ipc_wire import CudaIPCData
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper, register_ipc_wrapper

CUDA_WIRE_TAG = "cuda"


def device_uuid(index: int) -> str:
    """The UUID torch reports for CUDA device ``index`` ('' when unknown)."""
    try:
        return str(torch.cuda.get_device_properties(index).uuid)
    except Exception:
        return ""


def device_index_for_uuid(uuid: str, fallback: int) -> int:
    """Local ordinal of the GPU with ``uuid``; ``fallback`` when no visible GPU matches."""
    if uuid:
        for index in range(torch.cuda.device_count()):
            if device_uuid(index) == uuid:
                return index
    return fallback


def _normalize_handle(handle: Any) -> tuple[Any, ...]:
    values = tuple(handle)
    if len(values) != 8:
        raise ValueError(f"a CUDA IPC handle has 8 fields, got {len(values)}")
    return tuple(bytes(v) if isinstance(v, (bytearray, memoryview)) else v for v in values)


@register_ipc_wrapper(CUDA_WIRE_TAG)
class CudaIPCWrapper(DeviceIPCWrapper):
    """CUDA IPC memory handle of a tensor's storage plus its view metadata."""

    device_type: ClassVar[str] = "cuda"

    def __init__(
        self,
        handle: Any,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        stride: tuple[int, ...],
        storage_offset: int = 0,
        device_uuid: str = "",
    ) -> None:
        super().__init__(
            _normalize_handle(handle), dtype, shape, stride, storage_offset, device_uuid
        )
        self._mapped: torch.Tensor | None = None

    @classmethod
    def wrap(cls, tensor: torch.Tensor) -> CudaIPCWrapper:
        if tensor.device.type != "cuda":
            raise ValueError(f"CudaIPCWrapper.wrap needs a CUDA tensor, got {tensor.device}")
        handle = tensor.untyped_storage()._share_cuda_()
        return cls(
            handle,
            tensor.dtype,
            tuple(tensor.shape),
            tuple(tensor.stride()),
            int(tensor.storage_offset()),
            device_uuid(tensor.device.index or 0),
        )

    def to_tensor(self) -> torch.Tensor:
        """Map the worker's memory into this process (once per wrapper; zero-copy)."""
        if self._mapped is None:
            fields = list(self.handle)
            fields[0] = device_index_for_uuid(self.device_uuid, int(fields[0]))
            storage = torch.UntypedStorage._new_shared_cuda(*fields)
            tensor = torch.empty(0, dtype=self.dtype, device=torch.device("cuda", fields[0]))
            tensor.set_(storage, self.storage_offset, self.shape, self.stride)
            self._mapped = tensor
        return self._mapped

    def close(self) -> None:
        self._mapped = None

    def to_wire(self) -> CudaIPCData:
        return CudaIPCData(metadata=self.wire_metadata(), handle=self.handle)

    @classmethod
    def from_wire(cls, data: Any) -> CudaIPCWrapper:
        if not isinstance(data, CudaIPCData):
            raise ValueError(f"CudaIPCWrapper cannot decode {type(data).__name__}")
        meta = data.metadata
        wrapper = cls(data.handle, torch.uint8, meta.shape, meta.stride)
        wrapper.restore_metadata(meta)
        return wrapper
