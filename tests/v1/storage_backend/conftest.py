"""Fixtures for the storage tests: small tiers, keys, objects and a backend factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from redis_servers import (  # noqa: F401 (fixtures)
    own_redis_cluster,
    own_redis_server,
    redis_cluster,
    redis_server,
)

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager

PLUGIN_SPEC = "storage_test_plugin:DictStoragePlugin"
OBJ_SHAPE = torch.Size([2, 2, 16, 32])  # 4 KiB of half
OBJ_DTYPE = torch.half


def make_key(i: int, model: str = "org/model", worker: int = 0) -> CacheEngineKey:
    return CacheEngineKey(model, 1, worker, i, OBJ_DTYPE)


def make_config(**overrides: Any) -> LMCacheEngineConfig:
    values: dict[str, Any] = {"max_local_cpu_size": "1MiB", "blocking_timeout_secs": 1}
    values.update(overrides)
    return LMCacheEngineConfig.from_defaults(**values)


def fill_obj(backend: Any, value: int, shape: torch.Size = OBJ_SHAPE) -> MemoryObj:
    obj = backend.get_allocator_backend().allocate(shape, OBJ_DTYPE, busy_loop=False)
    assert obj is not None
    obj.tensor.copy_(torch.arange(shape.numel(), dtype=torch.float32).reshape(shape) + value)
    return obj


def expected_tensor(value: int, shape: torch.Size = OBJ_SHAPE) -> torch.Tensor:
    return (torch.arange(shape.numel(), dtype=torch.float32).reshape(shape) + value).half()


def wait_all(backend: StorageBackendInterface, result: Any) -> None:
    for future in result or []:
        future.result()
    waiter = getattr(backend, "wait_for_puts", None)
    if waiter is not None:
        waiter()


def put(backend: StorageBackendInterface, key: CacheEngineKey, value: int) -> None:
    """Allocate, fill, store, wait, and drop the caller's reference."""
    obj = fill_obj(backend, value)
    wait_all(backend, backend.batched_submit_put_task([key], [obj]))
    obj.ref_count_down()


BackendFactory = Callable[..., StorageBackendInterface]


@pytest.fixture
def backend_factory(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[[str], StorageBackendInterface]]:
    made: list[StorageBackendInterface] = []

    def make(kind: str, **overrides: Any) -> StorageBackendInterface:
        disk_dir = str(tmp_path / f"disk{len(made)}")
        backend: StorageBackendInterface
        if kind == "cpu":
            backend = LocalCPUBackend(make_config(**overrides))
        elif kind == "disk":
            config = make_config(local_disk=disk_dir, max_local_disk_size="1MiB", **overrides)
            cpu = LocalCPUBackend(make_config(local_cpu=False, **overrides))
            made.append(cpu)
            backend = LocalDiskBackend(config, cpu)
        elif kind == "manager":
            config = make_config(
                local_disk=disk_dir,
                max_local_disk_size="1MiB",
                storage_plugins=[PLUGIN_SPEC],
                **overrides,
            )
            backend = StorageManager(config)
        elif kind == "plugin":
            from storage_test_plugin import DictStoragePlugin

            cpu = LocalCPUBackend(make_config(local_cpu=False))
            made.append(cpu)
            backend = DictStoragePlugin(
                config=make_config(), dst_device="cpu", local_cpu_backend=cpu
            )
        elif kind == "l2adapter":
            from lmcache.v1.storage_backend.l2_adapters.bridge import L2AdapterBackend
            from lmcache.v1.storage_backend.l2_adapters.mock_l2_adapter import (
                MockL2Adapter,
                MockL2AdapterConfig,
            )

            cpu = LocalCPUBackend(make_config(local_cpu=False, **overrides))
            made.append(cpu)
            adapter = MockL2Adapter(MockL2AdapterConfig(max_size_gb=0.01, mock_bandwidth_gb=10))
            backend = L2AdapterBackend(adapter, "L2Adapter0:mock", cpu)
        elif kind in ("redis", "redis_cluster"):
            from redis_servers import make_redis_backend

            cpu = LocalCPUBackend(make_config(local_cpu=False, **overrides))
            made.append(cpu)
            server = request.getfixturevalue("redis_server" if kind == "redis" else kind)
            backend = make_redis_backend(server.url, cpu, cluster=kind == "redis_cluster")
        else:
            raise ValueError(kind)
        made.append(backend)
        return backend

    yield make
    for backend in reversed(made):
        backend.close()


@pytest.fixture(params=["cpu", "disk", "manager", "plugin", "l2adapter", "redis", "redis_cluster"])
def backend(request: pytest.FixtureRequest, backend_factory: Any) -> StorageBackendInterface:
    made: StorageBackendInterface = backend_factory(request.param)
    return made
