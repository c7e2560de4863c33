"""Two independent storage stacks (as two cache servers would run) sharing one Redis."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

import pytest
import torch
from conftest import fill_obj, make_config, make_key
from redis_servers import make_redis_backend

from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.redis_backend import RedisBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager

pytestmark = pytest.mark.redis


def _stack(url: str, namespace: str, cluster: bool) -> tuple[StorageManager, RedisBackend]:
    cpu = LocalCPUBackend(make_config(max_local_cpu_size="2MiB"))
    tier = make_redis_backend(url, cpu, cluster=cluster, namespace=namespace)
    backends: OrderedDict[str, StorageBackendInterface] = OrderedDict()
    backends["LocalCPUBackend"] = cpu
    backends["RedisBackend"] = tier
    return StorageManager(make_config(), backends=backends), tier


@pytest.mark.parametrize("kind", ["redis_server", "redis_cluster"])
def test_chunk_stored_through_a_is_bit_exact_through_b(
    request: pytest.FixtureRequest, kind: str
) -> None:
    server: Any = request.getfixturevalue(kind)
    namespace = f"shared-{kind}"
    a, a_tier = _stack(server.url, namespace, kind == "redis_cluster")
    b, b_tier = _stack(server.url, namespace, kind == "redis_cluster")
    try:
        keys = [make_key(i, model="org/shared") for i in range(6)]
        objs = [fill_obj(a, 0) for _ in keys]
        for obj in objs:  # random bits, including NaN/denormal patterns, must survive
            obj.byte_array[:] = torch.randint(0, 256, (obj.get_size(),), dtype=torch.uint8).numpy()
        sent = [bytes(obj.byte_array) for obj in objs]
        a.batched_submit_put_task(keys[:5], objs[:5])
        a.wait_for_puts()
        for obj in objs:
            obj.ref_count_down()
        assert b.batched_contains(keys) == 5  # B's L1 is empty: all from Redis
        got = b.batched_get_blocking(keys)
        assert got[5] is None
        for obj, want in zip(got[:5], sent):
            assert obj is not None and bytes(obj.byte_array) == want
            assert obj.get_shape() == objs[0].get_shape() and obj.get_dtype() == torch.half
            obj.ref_count_down()
        fetched = asyncio.run(b_tier.batched_get_non_blocking("req", keys))
        assert [bytes(o.byte_array) for o in fetched] == sent[:5]
        for obj in fetched:
            obj.ref_count_down()
        # Another namespace (deployment) does not see them.
        other = make_redis_backend(
            server.url, b.local_cpu_backend, cluster=kind == "redis_cluster", namespace="other"
        )
        assert other.batched_contains(keys) == 0
        other.close()
    finally:
        a_tier.batched_remove([make_key(i, model="org/shared") for i in range(6)])
        a.close()
        b.close()
