"""Device helpers shared by the conformance tests and the processes they start.

A backend whose ``torch_module_name`` is ``cpu`` keeps its KV in host memory, which another
process can only map when it lives in a shared-memory segment; any other backend's tensors
live on its torch device and travel through its ``DeviceIPCWrapper`` as they are.
"""

from __future__ import annotations

from typing import Any

import torch

# Cycles of ``torch.<module>._sleep`` (CUDA / ROCm): about a second on current GPUs, far
# longer than the hand-over to another process, so unordered reads would see stale data.
_SLEEP_CYCLES = 2_000_000_000
# Without ``_sleep``, a chain of matmuls keeps an asynchronous device busy a while.
_BUSY_MATMULS = 24
_BUSY_SIZE = 2048


def torch_device_of(spec: Any) -> str:
    """Torch device of the backend's memory (host-memory backends use ``cpu``)."""
    if spec.torch_module_name == "cpu":
        return "cpu"
    return str(spec.device_type)


def shareable_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """A zeroed tensor another process can map through the backend's IPC wrapper."""
    if device != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    from lmcache.v1.platform.cpu.shm import empty_shm_tensor

    return empty_shm_tensor(shape, dtype)


def release(tensors: list[torch.Tensor]) -> None:
    """Unlink the shared-memory segments of host tensors (device memory needs nothing)."""
    from lmcache.v1.platform.cpu.shm import shm_segment_of, unlink_segment

    for tensor in tensors:
        name = shm_segment_of(tensor) if tensor.device.type == "cpu" else None
        if name:
            unlink_segment(name)


def delay_current_stream(spec: Any, device: str) -> bool:
    """Queue slow work on the device's current stream, so work queued after it is still
    pending a moment later; True when that is certain (a timed ``_sleep`` kernel).

    Host work is synchronous: nothing to queue, and ordering is trivially kept.
    """
    if device == "cpu":
        return False
    module = getattr(torch, spec.torch_module_name, None)
    sleep = getattr(module, "_sleep", None)
    if callable(sleep):
        sleep(_SLEEP_CYCLES)
        return True
    busy = torch.ones(_BUSY_SIZE, _BUSY_SIZE, device=device)
    for _ in range(_BUSY_MATMULS):
        busy = busy @ busy / _BUSY_SIZE
    return False


def pattern(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int) -> torch.Tensor:
    """Non-zero values made on the device itself (queued on its stream, no host copy)."""
    numel = 1
    for dim in shape:
        numel *= dim
    values = (torch.arange(numel, device=device, dtype=torch.int64) * 7 + seed) % 251 + 1
    return values.reshape(shape).to(dtype)


def digest(tensor: torch.Tensor) -> str:
    """sha256 of the tensor's bytes (read on the host: waits for the current stream)."""
    import hashlib

    host = tensor.to("cpu", copy=True).contiguous()
    return hashlib.sha256(host.view(torch.uint8).numpy().tobytes()).hexdigest()
