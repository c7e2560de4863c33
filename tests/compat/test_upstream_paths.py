"""Upstream 0.5.6 import paths added for code written against it: lmcache.lmcache_native,
platform.ipc_policy, platform.devices.<name>, posix_shm."""

from __future__ import annotations

import ctypes
import os
import uuid
from collections.abc import Iterator

import pytest

from lmcache import lmcache_native
from lmcache.compat.upstream_056.posix_shm import (
    shm_create_readwrite,
    shm_map_readwrite,
    shm_munmap,
    shm_open_pool_as_mmap,
    shm_unlink,
)
from lmcache.v1.platform import ipc_policy, ops_types


def test_native_names_are_the_ops_types_objects() -> None:
    assert lmcache_native.TransferDirection is ops_types.TransferDirection
    assert lmcache_native.EngineKVFormat.NL_X_NB_BS_NH_HS == 18
    assert lmcache_native.GPUKVFormat is lmcache_native.EngineKVFormat
    assert lmcache_native.is_mla(lmcache_native.EngineKVFormat.NL_X_NB_BS_HS)
    # Upstream's general helpers are the pure-Python ones; its fold / unfold are not.
    from lmcache.v1 import native_compat

    for name in native_compat.__all__:
        assert getattr(lmcache_native, name) is getattr(native_compat, name)
    assert set(native_compat.__all__) == {
        "Bitmap",
        "ParallelPatternMatcher",
        "PeriodicEventNotifier",
        "RangePatternMatcher",
        "TTLLock",
    }
    for name in ("fold", "unfold", "fold_grouped", "unfold_grouped"):
        assert not hasattr(lmcache_native, name)


@pytest.fixture
def _policy() -> Iterator[ipc_policy.IPCPolicy]:
    before = (ipc_policy.is_isolated_ipc(), ipc_policy.is_use_vmm_api())
    yield ipc_policy.get_ipc_policy()
    ipc_policy.set_ipc_policy(isolated_ipc=before[0], use_vmm_api=before[1])


def test_ipc_policy_is_one_object_updated_in_place(_policy: ipc_policy.IPCPolicy) -> None:
    assert ipc_policy.set_ipc_policy(isolated_ipc=True) is _policy is ipc_policy.current_ipc_policy
    assert ipc_policy.set_use_vmm_api(True).isolated_ipc is True
    assert ipc_policy.is_use_vmm_api() is True
    assert _policy.with_isolated_ipc(False) is _policy and not ipc_policy.is_isolated_ipc()


def test_ipc_policy_refuses_non_bools(_policy: ipc_policy.IPCPolicy) -> None:
    with pytest.raises(TypeError, match="isolated_ipc must be a bool"):
        ipc_policy.set_isolated_ipc("false")  # type: ignore[arg-type]


def test_devices_cpu_is_the_in_tree_backend() -> None:
    from lmcache.compat.upstream_056.devices.cpu import CpuDeviceSpec as UpstreamPath
    from lmcache.compat.upstream_056.devices.cpu.shm import CpuShmTensorWrapper
    from lmcache.v1.platform.cpu import CpuDeviceSpec

    assert UpstreamPath is CpuDeviceSpec
    assert CpuDeviceSpec().ipc_wrapper_cls is CpuShmTensorWrapper


def test_devices_cuda_without_the_plugin_names_the_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    from lmcache.v1.platform import devices

    monkeypatch.setattr(
        "lmcache.v1.platform.registry.get_registry",
        lambda: type("R", (), {"backends": {}})(),
    )
    with pytest.raises(ImportError, match="pip install lmcache-cuda"):
        from lmcache.compat.upstream_056.devices.cuda import CudaDeviceSpec  # noqa: F401
    with pytest.raises(ImportError, match="lmcache-cuda"):
        devices.plugin_spec("rocm", "lmcache-cuda", "RocmDeviceSpec")


def test_devices_cuda_resolves_to_the_registered_class(monkeypatch: pytest.MonkeyPatch) -> None:
    from lmcache.v1.platform.cpu import CpuDeviceSpec

    spec = CpuDeviceSpec()
    backend = type("B", (), {"spec": spec})()
    monkeypatch.setattr(
        "lmcache.v1.platform.registry.get_registry",
        lambda: type("R", (), {"backends": {"cuda": backend}})(),
    )
    from lmcache.compat.upstream_056.devices.cuda import CudaDeviceSpec
    from lmcache.compat.upstream_056.devices.cuda.ipc_wrapper import CudaIPCWrapper

    assert CudaDeviceSpec is CpuDeviceSpec
    assert CudaIPCWrapper is spec.ipc_wrapper_cls


def test_devices_pin_memory_paths_resolve_to_the_registered_backends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pinned = {name: type(f"{name}Pin", (), {}) for name in ("cuda", "rocm")}
    backends = {
        name: type("B", (), {"spec": type("S", (), {"pin_memory_backend": cls})()})()
        for name, cls in pinned.items()
    }
    monkeypatch.setattr(
        "lmcache.v1.platform.registry.get_registry",
        lambda: type("R", (), {"backends": backends})(),
    )
    from lmcache.compat.upstream_056.devices.cuda.pin_memory import CudaPinMemoryBackend
    from lmcache.compat.upstream_056.devices.rocm import pin_memory

    assert CudaPinMemoryBackend is pinned["cuda"]
    assert pin_memory.RocmPinMemoryBackend is pinned["rocm"]
    del backends["rocm"]
    with pytest.raises(ImportError, match="registers the 'rocm' backend: pip install lmcache-cuda"):
        pin_memory.RocmPinMemoryBackend  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'RawPinMemoryBackend'"):
        pin_memory.RawPinMemoryBackend  # noqa: B018


def test_posix_shm_create_map_unmap_unlink() -> None:
    name = f"/lmcache_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    writer = shm_create_readwrite(name, 4096)
    try:
        with pytest.raises(FileExistsError):
            shm_create_readwrite(name, 4096)
        reader = shm_map_readwrite(name, 4096)
        ctypes.memset(writer, 9, 4)
        view = (ctypes.c_ubyte * 4).from_address(reader)
        assert list(view) == [9, 9, 9, 9]  # one set of pages, two mappings
        with pytest.raises(ValueError, match="fewer than"):
            shm_map_readwrite(name, 8192)
        shm_munmap(reader)
    finally:
        shm_munmap(writer)
        shm_unlink(name)
    with pytest.raises(ValueError, match="not a mapping"):
        shm_munmap(writer)
    shm_munmap(0, 4096)  # no mapping: a no-op, as upstream's
    shm_unlink(name)  # already gone: not an error
    with pytest.raises(ValueError, match="invalid POSIX shared-memory name"):
        shm_create_readwrite("/a/b", 16)


def test_shm_open_pool_as_mmap_is_an_owned_view_of_the_segment() -> None:
    name = f"/lmc_test_pool_{uuid.uuid4().hex[:12]}"
    writer = shm_create_readwrite(name, 4096)
    try:
        pool = shm_open_pool_as_mmap(name, 4096)
        try:
            pool[0:3] = b"abc"
            assert (ctypes.c_char * 3).from_address(writer).raw == b"abc"
        finally:
            pool.close()  # the caller's to close; the address mapping stays
        assert (ctypes.c_char * 3).from_address(writer).raw == b"abc"
    finally:
        shm_munmap(writer)
        shm_unlink(name)
    with pytest.raises(FileNotFoundError):
        shm_open_pool_as_mmap(name, 4096)
