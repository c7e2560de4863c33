"""The backend's IPC wrapper survives the wire (msgpack, never pickle) unchanged, and a
host-memory backend's wrapper maps back to the very same bytes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper


@pytest.fixture
def wrapper_cls(available_spec: Any) -> type[DeviceIPCWrapper]:
    cls = available_spec.ipc_wrapper_cls
    if cls is None:
        pytest.skip(f"backend {available_spec.backend_name!r} declares no IPC wrapper")
    return cls  # type: ignore[no-any-return]


@pytest.fixture
def shared_tensor(device: str) -> Iterator[torch.Tensor]:
    """A KV-like tensor the wrapper can share: a shared-memory segment for host memory."""
    if device != "cpu":
        yield torch.arange(2 * 5 * 4 * 8, dtype=torch.float16).reshape(2, 5, 4, 8).to(device)
        return
    from lmcache.v1.platform.cpu.shm import empty_shm_tensor, shm_segment_of, unlink_segment

    tensor = empty_shm_tensor((2, 5, 4, 8), torch.float16)
    tensor.copy_(torch.arange(tensor.numel(), dtype=torch.float16).reshape(tensor.shape))
    try:
        yield tensor
    finally:
        name = shm_segment_of(tensor)
        if name:
            unlink_segment(name)


def test_wrapper_declares_the_spec_device_type(
    available_spec: Any, wrapper_cls: type[DeviceIPCWrapper]
) -> None:
    assert callable(getattr(wrapper_cls, "wrap", None))
    declared = wrapper_cls.device_type
    assert declared in ("", available_spec.device_type)


def test_wire_round_trip_is_lossless(
    wrapper_cls: type[DeviceIPCWrapper], shared_tensor: torch.Tensor
) -> None:
    wrapper = wrapper_cls.wrap(shared_tensor)
    data = DeviceIPCWrapper.Serialize(wrapper)
    again = DeviceIPCWrapper.Deserialize(data)
    assert type(again) is type(wrapper)
    assert again == wrapper
    assert again.shape == tuple(shared_tensor.shape)
    assert again.dtype == shared_tensor.dtype


def test_host_memory_wrapper_maps_the_same_bytes(
    wrapper_cls: type[DeviceIPCWrapper], shared_tensor: torch.Tensor, device: str
) -> None:
    if device != "cpu":
        pytest.skip("device handles are opened by another process (the server round trip)")
    again = DeviceIPCWrapper.Deserialize(
        DeviceIPCWrapper.Serialize(wrapper_cls.wrap(shared_tensor))
    )
    mapped = again.to_tensor()
    try:
        assert torch.equal(mapped, shared_tensor)
        mapped[0, 0, 0, 0] = -7.0  # shared pages: the worker sees the server's writes
        assert shared_tensor[0, 0, 0, 0].item() == -7.0
    finally:
        again.close()


def test_garbage_on_the_wire_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        DeviceIPCWrapper.Deserialize(b"\x80\x04not msgpack")
