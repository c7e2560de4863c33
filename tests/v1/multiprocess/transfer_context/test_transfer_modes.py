"""Transfer-mode selection (AUTO, env, explicit), the hard checks, and server enforcement."""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest
import torch
from mp_server_helpers import CHUNK_SIZE, ServerProcess, make_kv, unlink_kv

from lmcache.v1.multiprocess.transfer_context import (
    engine_driven,
    lmcache_driven,
    worker_transfer,
)
from lmcache.v1.multiprocess.transfer_context.worker_transfer import (
    EngineDrivenTransferContext,
    LMCacheDrivenTransferContext,
    create_transfer_context,
)
from lmcache.v1.multiprocess.worker.client import ServerError
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker
from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
from lmcache.v1.platform.cpu.event_ipc import HostEventIPCBackend


class _FakeTensor:
    """Only ``.device.type`` is read before a context is built."""

    def __init__(self, device_type: str) -> None:
        self.device = types.SimpleNamespace(type=device_type)


class _Wrapper(DeviceIPCWrapper):
    @classmethod
    def wrap(cls, tensor: torch.Tensor) -> DeviceIPCWrapper:
        return cls(None, torch.float16, (), ())


class _FakeSpec(DeviceSpec):
    def __init__(
        self, name: str, wrapper: Any = _Wrapper, handles: bool = True, events: Any = None
    ) -> None:
        super().__init__()
        self._name, self._wrapper, self._handles, self._events = name, wrapper, handles, events

    @property
    def device_type(self) -> str:
        return self._name

    @property
    def backend_name(self) -> str:
        return f"fake_{self._name}"

    @property
    def ipc_wrapper_cls(self) -> Any:
        return self._wrapper

    def is_handle_transfer_available(self) -> bool:
        return self._handles

    @property
    def event_ipc_backend(self) -> Any:
        return self._events


@pytest.fixture
def fake_specs(monkeypatch: pytest.MonkeyPatch) -> dict[str, DeviceSpec]:
    specs: dict[str, DeviceSpec] = {}
    real = worker_transfer.get_device_spec
    # The factory looks specs up in worker_transfer, registration in lmcache_driven.
    for module in (worker_transfer, lmcache_driven):
        monkeypatch.setattr(module, "get_device_spec", lambda t: specs.get(t) or real(t))
    monkeypatch.delenv("LMCACHE_MP_TRANSFER_MODE", raising=False)
    return specs


def _create(device_type: str, mode: Any = None, **kw: Any) -> Any:
    return create_transfer_context(
        [_FakeTensor(device_type)], instance_id=1, req_client=None, mode=mode, **kw
    )  # type: ignore[list-item]


def test_auto_dispatches_strictly_by_device_type(
    fake_specs: dict[str, DeviceSpec], caplog: pytest.LogCaptureFixture
) -> None:
    fake_specs["cuda"] = _FakeSpec("cuda")
    fake_specs["foo"] = _FakeSpec("foo")  # capable of LMCache-driven, still engine-driven
    with caplog.at_level(logging.INFO, logger=worker_transfer.__name__):
        assert isinstance(_create("cuda"), LMCacheDrivenTransferContext)
        assert isinstance(_create("foo"), EngineDrivenTransferContext)
        assert isinstance(_create("cpu", "AUTO"), EngineDrivenTransferContext)
    assert "Creating transfer context (device_type=cuda, mode=lmcache_driven)" in caplog.text
    assert "Creating transfer context (device_type=foo, mode=engine_driven)" in caplog.text


def test_env_and_explicit_override(
    fake_specs: dict[str, DeviceSpec], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LMCACHE_MP_TRANSFER_MODE", "lmcache_driven")
    assert isinstance(_create("cpu"), LMCacheDrivenTransferContext)
    assert isinstance(_create("cpu", "engine_driven"), EngineDrivenTransferContext)
    monkeypatch.setenv("LMCACHE_MP_TRANSFER_MODE", "bogus")
    with pytest.raises(ValueError, match="valid values"):
        _create("cpu")


def test_hard_check_wrapper_factory(fake_specs: dict[str, DeviceSpec]) -> None:
    fake_specs["foo"] = _FakeSpec("foo", wrapper=None)
    with pytest.raises(ValueError, match=r"fake_foo.*wrap classmethod"):
        _create("foo", "lmcache_driven")
    fake_specs["bar"] = _FakeSpec("bar", wrapper=DeviceIPCWrapper)  # base wrap() not overridden
    with pytest.raises(ValueError, match=r"fake_bar.*no KV-cache wrapper factory"):
        _create("bar", "lmcache_driven")


def test_hard_check_handle_transfer(fake_specs: dict[str, DeviceSpec]) -> None:
    fake_specs["foo"] = _FakeSpec("foo", handles=False)
    with pytest.raises(ValueError, match=r"fake_foo.*is_handle_transfer_available"):
        _create("foo", "lmcache_driven")


def test_event_ipc_checked_at_registration(fake_specs: dict[str, DeviceSpec]) -> None:
    fake_specs["meta"] = _FakeSpec("meta", events=None)
    kv = [torch.empty(2, 4, 4, 2, 8, device="meta")]
    ctx = create_transfer_context(kv, instance_id=1, req_client=None, mode="lmcache_driven")
    with pytest.raises(ValueError, match=r"fake_meta.*event_ipc_backend is None"):
        ctx.register(kv, "m", 1, 4, 1.0)
    fake_specs["meta"] = _FakeSpec("meta", events=HostEventIPCBackend())  # cpu-only events
    ctx = create_transfer_context(kv, instance_id=1, req_client=None, mode="lmcache_driven")
    with pytest.raises(ValueError, match=r"fake_meta.*cannot provide it"):
        ctx.register(kv, "m", 1, 4, 1.0)


def test_mixed_or_empty_kv_caches() -> None:
    with pytest.raises(ValueError, match="at least one"):
        create_transfer_context([], instance_id=1, req_client=None)
    with pytest.raises(ValueError, match="several device types"):
        create_transfer_context(
            [torch.zeros(1), torch.zeros(1, device="meta")], instance_id=1, req_client=None
        )


def test_kv_cache_not_in_shared_memory_says_how_to_fix(auto_server: ServerProcess) -> None:
    kv = make_kv(shm=False)
    with pytest.raises(ValueError, match=r"empty_shm_tensor.*migrate_to_shm_and_wrap"):
        KVCacheWorker(kv, model_name="noshm", server_url=auto_server.url, mode="lmcache_driven")


def test_migrated_kv_cache_works(auto_server: ServerProcess) -> None:
    from lmcache.v1.platform.cpu.shm import migrate_to_shm_and_wrap

    kv = make_kv(shm=False, seed=9)
    for tensor in kv:
        migrate_to_shm_and_wrap(tensor)
    out = make_kv(shm=True, seed=None)
    worker = KVCacheWorker(
        kv, model_name="migrated", server_url=auto_server.url, mode="lmcache_driven"
    )
    reader = KVCacheWorker(
        out, model_name="migrated", server_url=auto_server.url, mode="lmcache_driven"
    )
    try:
        tokens = list(range(CHUNK_SIZE))
        assert worker.store(tokens, [4, 5, 6, 7])
        assert reader.retrieve(tokens, [0, 1, 2, 3])
        assert all(torch.equal(a[:, 4:8], b[:, 0:4]) for a, b in zip(kv, out))
    finally:
        worker.close()
        reader.close()
        unlink_kv(kv + out)


@pytest.fixture(scope="module")
def lmcache_only_server(server_factory: Any) -> ServerProcess:
    return server_factory("--supported-transfer-mode", "lmcache_driven")


@pytest.fixture(scope="module")
def engine_only_server(server_factory: Any) -> ServerProcess:
    return server_factory("--supported-transfer-mode", "engine_driven", "--shm-name", "")


def test_lmcache_only_server_refuses_engine_driven(lmcache_only_server: ServerProcess) -> None:
    with pytest.raises(ServerError) as info:
        KVCacheWorker(
            make_kv(), model_name="m", server_url=lmcache_only_server.url, mode="engine_driven"
        )
    assert info.value.code == "unsupported_transfer_mode"
    assert "--supported-transfer-mode" in info.value.message
    kv = make_kv(shm=True)
    try:
        with KVCacheWorker(
            kv, model_name="m", server_url=lmcache_only_server.url, mode="lmcache_driven"
        ) as worker:
            assert worker.store(list(range(CHUNK_SIZE)), [0, 1, 2, 3])
    finally:
        unlink_kv(kv)


def test_engine_only_server_refuses_lmcache_driven_and_goes_inline(
    engine_only_server: ServerProcess,
) -> None:
    kv = make_kv(shm=True)
    try:
        with pytest.raises(ServerError) as info:
            KVCacheWorker(
                kv, model_name="m", server_url=engine_only_server.url, mode="lmcache_driven"
            )
        assert info.value.code == "unsupported_transfer_mode"
    finally:
        unlink_kv(kv)
    src, dst = make_kv(seed=11), make_kv(seed=None)
    with (
        KVCacheWorker(src, model_name="m", server_url=engine_only_server.url) as writer,
        KVCacheWorker(dst, model_name="m", server_url=engine_only_server.url) as reader,
    ):
        assert writer.sub_path == "inline"  # the server has no shared memory
        tokens = list(range(2 * CHUNK_SIZE))
        assert writer.store(tokens, list(range(8)))
        assert reader.retrieve(tokens, list(range(8, 16)))
        assert all(torch.equal(a[:, :8], b[:, 8:16]) for a, b in zip(src, dst))
    with pytest.raises(ValueError, match="'shm' was forced"):
        KVCacheWorker(make_kv(), model_name="m", server_url=engine_only_server.url, sub_path="shm")


def test_sub_path_choice_is_logged(
    auto_server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=engine_driven.__name__):
        with KVCacheWorker(make_kv(), model_name="log", server_url=auto_server.url) as worker:
            assert worker.sub_path == "shm"
        with KVCacheWorker(
            make_kv(), model_name="log", server_url=auto_server.url, sub_path="inline"
        ):
            pass
    assert "engine-driven sub-path: SHM" in caplog.text
    assert "engine-driven sub-path: inline" in caplog.text


@pytest.fixture(scope="module")
def default_server(server_factory: Any) -> ServerProcess:
    return server_factory()  # no --supported-transfer-mode: the default must be auto


def test_plain_server_serves_the_default_worker_both_ways(default_server: ServerProcess) -> None:
    """A plain `lmcache server` accepts the CPU worker's default (engine_driven, which is
    also what vLLM's `auto` picks on CPU) and an lmcache_driven worker; bytes round-trip."""
    with default_server.client() as client:
        assert client.get_stats().supported_transfer_mode == "auto"
    tokens = list(range(CHUNK_SIZE))
    for mode, shm in ((None, False), ("lmcache_driven", True)):
        kv, out = make_kv(shm=shm, seed=1), make_kv(shm=shm, seed=None)
        try:
            with KVCacheWorker(kv, model_name=f"d-{mode}", server_url=default_server.url,
                               mode=mode) as writer:  # fmt: skip
                if mode is None:
                    assert writer.mode.value == "engine_driven"
                assert writer.store(tokens, [0, 1, 2, 3])
            with KVCacheWorker(out, model_name=f"d-{mode}", server_url=default_server.url,
                               mode=mode) as reader:  # fmt: skip
                assert reader.lookup(tokens) == CHUNK_SIZE
                assert reader.retrieve(tokens, [4, 5, 6, 7])
            assert all(torch.equal(a[:, 0:4], b[:, 4:8]) for a, b in zip(kv, out))
        finally:
            unlink_kv(kv + out)
