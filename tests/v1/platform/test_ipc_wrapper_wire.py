"""DeviceIPCWrapper wire encoding: allowlisted tags only, lazy wrapper registration."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import torch

from lmcache.v1.platform.base.ipc_wire import CpuShmIPCData, PluginIPCData, TensorMetadata
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper


def test_pickle_bytes_are_refused() -> None:
    import pickle

    with pytest.raises(ValueError, match="pickled wrappers are refused"):
        DeviceIPCWrapper.Deserialize(pickle.dumps({"handle": 1}))


def test_unknown_tag_is_refused() -> None:
    payload = msgspec.msgpack.encode({"type": "quantum", "version": 1})
    with pytest.raises(ValueError):
        DeviceIPCWrapper.Deserialize(payload)


def test_unregistered_subclass_cannot_be_serialized() -> None:
    class Rogue(DeviceIPCWrapper):
        pass

    with pytest.raises(ValueError, match="Unsupported IPC wrapper type"):
        DeviceIPCWrapper.Serialize(
            Rogue(None, dtype=__import__("torch").float32, shape=(1,), stride=(1,))
        )


DECODE_WITHOUT_IMPORTING_SHM = """
import json, sys
import msgspec
from lmcache.v1.platform.base.ipc_wire import CpuShmIPCData, TensorMetadata
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
assert "lmcache.v1.platform.cpu.shm" not in sys.modules
data = CpuShmIPCData(
    metadata=TensorMetadata(dtype="float32", shape=(4,), stride=(1,), storage_offset=0,
                            device_uuid=""),
    shm_name=sys.argv[1] if len(sys.argv) > 1 else "/lmcache_kv_missing_segment", nbytes=16)
try:
    wrapper = DeviceIPCWrapper.Deserialize(msgspec.msgpack.encode(data))
    print(json.dumps(type(wrapper).__name__))
except Exception as exc:
    print(json.dumps(f"{type(exc).__name__}: {exc}"))
"""


def test_backend_wrappers_are_loaded_lazily_on_first_unknown_tag(run_python_json: Any) -> None:
    # The cpu_shm class registers itself on import; Deserialize must find it through the
    # registry instead of refusing the tag as unknown.
    result = run_python_json(DECODE_WITHOUT_IMPORTING_SHM)
    assert "not supported by this server" not in result
    assert result == "CpuShmTensorWrapper"


def test_metadata_round_trips() -> None:
    data = CpuShmIPCData(
        metadata=TensorMetadata("bfloat16", (2, 3), (3, 1), 0, "host"), shm_name="/x", nbytes=12
    )
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(data), type=CpuShmIPCData)
    assert decoded == data


def _meta() -> TensorMetadata:
    return TensorMetadata(
        dtype="float16", shape=(2,), stride=(1,), storage_offset=0, device_uuid=""
    )


def test_plugin_kind_must_be_registered() -> None:
    data = PluginIPCData(kind="no_such_kind", metadata=_meta(), payload=b"\x80")
    with pytest.raises(ValueError, match="'no_such_kind' is not supported"):
        DeviceIPCWrapper.Deserialize(msgspec.msgpack.encode(data))


def test_plugin_kind_decodes_through_its_registered_wrapper() -> None:
    from lmcache.v1.platform.base.ipc_wrapper import register_ipc_wrapper

    @register_ipc_wrapper("test_plugin_kind")
    class Kind(DeviceIPCWrapper):
        @classmethod
        def from_wire(cls, data: Any) -> DeviceIPCWrapper:
            assert isinstance(data, PluginIPCData)
            return cls(msgspec.msgpack.decode(data.payload, type=str), torch.float16, (2,), (1,))

        def to_wire(self) -> PluginIPCData:
            payload = msgspec.msgpack.encode(self.handle)
            return PluginIPCData(kind="test_plugin_kind", metadata=_meta(), payload=payload)

    wrapper = Kind("segment-7", torch.float16, (2,), (1,))
    decoded = DeviceIPCWrapper.Deserialize(DeviceIPCWrapper.Serialize(wrapper))
    assert type(decoded) is Kind and decoded.handle == "segment-7"
    # A plugin kind never reaches a core wrapper that expects its own struct.
    forged = PluginIPCData(kind="cpu_shm", metadata=_meta(), payload=b"")
    with pytest.raises(ValueError, match="expected CpuShmIPCData"):
        DeviceIPCWrapper.Deserialize(msgspec.msgpack.encode(forged))
