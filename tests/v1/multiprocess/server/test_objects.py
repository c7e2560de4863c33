"""Named objects (``put_objects`` / ``get_objects`` / ``count_object_prefix``) on a real
server: round trips, longest-prefix counts, scope isolation, bounded memory, bad input."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mp_server_helpers import free_port

from lmcache.v1.multiprocess.server import MPServer, build_cache_server
from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.objects import OBJECT_MODEL_SUFFIX, object_key
from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.multiprocess.wire.custom_types import ObjectScope
from lmcache.v1.multiprocess.worker.client import MPClient, ServerError
from lmcache.v1.storage_backend.cache_salt import salt_of

L1_BYTES = 1024 * 1024
SCOPE = ObjectScope(model_name="m", world_size=2, worker_id=1)


def _serve(**overrides: Any) -> Iterator[tuple[MPClient, MPCacheServer]]:
    config = MPServerConfig(
        **{
            "port": free_port(),
            "chunk_size": 16,
            "l1_size_gb": L1_BYTES / 1024**3,
            "shm_name": "",
            "http_port": 0,
            "prometheus_port": 0,
            "disable_metrics": True,
            **overrides,
        }
    )
    engine = build_cache_server(config)
    server = MPServer(config, engine)
    loop = threading.Thread(target=server.serve_forever, daemon=True)
    loop.start()
    client = MPClient(server.endpoint, timeout=10)
    try:
        yield client, engine
    finally:
        client.close()
        server.request_stop()
        loop.join(15)
        server.close()


@pytest.fixture
def served() -> Iterator[tuple[MPClient, MPCacheServer]]:
    yield from _serve()


@pytest.fixture
def served_with_metrics() -> Iterator[tuple[MPClient, MPCacheServer]]:
    yield from _serve(disable_metrics=False)


@pytest.fixture
def served_with_disk(tmp_path: Path) -> Iterator[tuple[MPClient, MPCacheServer]]:
    yield from _serve(l2_disk_path=str(tmp_path), l2_disk_size_gb=0.0625)


def _blob(seed: int, size: int) -> bytes:
    return bytes((seed * 31 + i * 7) % 251 for i in range(size))


def test_objects_round_trip_bit_exact(served: tuple[MPClient, MPCacheServer]) -> None:
    client, engine = served
    blobs = {f"page-{i}": _blob(i, 100 + 1000 * i) for i in range(3)}
    assert client.put_objects(SCOPE, list(blobs), list(blobs.values())) == [True] * 3
    got = client.get_objects(SCOPE, ["page-2", "absent", "page-0", "page-1"])
    assert got[1] is None
    assert [bytes(v) for v in (got[2], got[3], got[0]) if v is not None] == list(blobs.values())
    stats = client.get_stats()
    assert (stats.stored_objects, stats.retrieved_objects) == (3, 3)
    # Stored under the model's object namespace, never as a token chunk of the model.
    models = {k.model_name for k in engine.storage.local_cpu_backend.get_keys()}
    assert models == {"m" + OBJECT_MODEL_SUFFIX}


def test_count_object_prefix_is_the_longest_stored_prefix(
    served: tuple[MPClient, MPCacheServer],
) -> None:
    client, _ = served
    assert client.put_objects(SCOPE, ["a", "c"], [b"1", b"3"]) == [True, True]
    assert client.count_object_prefix(SCOPE, ["a", "b", "c"]) == 1
    assert client.count_object_prefix(SCOPE, ["b", "a"]) == 0
    assert client.count_object_prefix(SCOPE, []) == 0
    client.put_objects(SCOPE, ["b"], [b"2"])
    assert client.count_object_prefix(SCOPE, ["a", "b", "c", "d"]) == 3


def test_a_stored_name_is_kept_not_rewritten(served: tuple[MPClient, MPCacheServer]) -> None:
    """Names are content hashes: putting a stored name again succeeds and stores nothing."""
    client, _ = served
    assert client.put_objects(SCOPE, ["x", "x"], [b"first", b"other"]) == [True, True]
    assert client.put_objects(SCOPE, ["x"], [b"again"]) == [True]
    assert client.get_stats().stored_objects == 1
    (value,) = client.get_objects(SCOPE, ["x"])
    assert value is not None and bytes(value) == b"first"


@pytest.mark.parametrize(
    "other",
    [
        ObjectScope(model_name="m", world_size=2, worker_id=0),
        ObjectScope(model_name="m", world_size=4, worker_id=1),
        ObjectScope(model_name="m2", world_size=2, worker_id=1),
        ObjectScope(model_name="m", world_size=2, worker_id=1, cache_salt="tenant-b"),
        ObjectScope(model_name="m", world_size=2, worker_id=1, shard="pp1of2"),
    ],
    ids=["rank", "world-size", "model", "tenant", "shard"],
)
def test_scopes_never_see_each_others_objects(
    served: tuple[MPClient, MPCacheServer], other: ObjectScope
) -> None:
    client, _ = served
    client.put_objects(SCOPE, ["p"], [b"mine"])
    assert client.count_object_prefix(other, ["p"]) == 0
    assert client.get_objects(other, ["p"]) == [None]
    client.put_objects(other, ["p"], [b"theirs"])
    (mine,), (theirs,) = client.get_objects(SCOPE, ["p"]), client.get_objects(other, ["p"])
    assert mine is not None and theirs is not None
    assert (bytes(mine), bytes(theirs)) == (b"mine", b"theirs")


def test_stored_objects_carry_their_tenant(served: tuple[MPClient, MPCacheServer]) -> None:
    client, engine = served
    salted = ObjectScope(model_name="m", world_size=2, worker_id=1, cache_salt="tenant-a")
    client.put_objects(salted, ["p"], [b"a"])
    client.put_objects(SCOPE, ["p"], [b"b"])
    keys = engine.storage.local_cpu_backend.get_keys()
    assert sorted(salt_of(k) for k in keys) == ["", "tenant-a"]
    assert object_key(salted, "p") in keys


def test_memory_stays_bounded_and_old_objects_are_evicted(
    served: tuple[MPClient, MPCacheServer],
) -> None:
    client, engine = served
    page = 64 * 1024
    names = [f"n{i}" for i in range(3 * L1_BYTES // page)]
    for name in names:
        assert client.put_objects(SCOPE, [name], [_blob(1, page)]) == [True]
    allocator = engine.storage.get_memory_allocator()
    assert allocator.used_bytes <= allocator.capacity_bytes
    # The newest are kept, the oldest were evicted to make room.
    assert client.count_object_prefix(SCOPE, names[-4:]) == 4
    assert client.count_object_prefix(SCOPE, names[:1]) == 0


def test_an_object_larger_than_l1_is_not_stored_and_the_server_answers(
    served: tuple[MPClient, MPCacheServer],
) -> None:
    client, _ = served
    assert client.put_objects(SCOPE, ["big", "small"], [b"\0" * (2 * L1_BYTES), b"s"]) == [
        False,
        True,
    ]
    assert client.count_object_prefix(SCOPE, ["small"]) == 1
    assert client.count_object_prefix(SCOPE, ["big"]) == 0


def test_bad_requests_get_typed_errors(served: tuple[MPClient, MPCacheServer]) -> None:
    client, _ = served
    with pytest.raises(ServerError, match="2 objects but sent 1 data frames") as exc:
        client.call_bulk("put_objects", SCOPE, ["a", "b"], frames=[b"x"])
    assert exc.value.code == "bad_payload"
    with pytest.raises(ServerError, match="empty object") as exc:
        client.put_objects(SCOPE, ["a"], [b""])
    assert exc.value.code == "bad_payload"
    bad_rank = {"model_name": "m", "world_size": 2, "worker_id": 2}
    with pytest.raises(ServerError, match="not a rank of world size 2") as exc:
        client.call("count_object_prefix", bad_rank, ["a"])
    assert exc.value.code == "bad_payload"
    bad_salt = {"model_name": "m", "world_size": 1, "worker_id": 0, "cache_salt": "a@b"}
    with pytest.raises(ServerError, match="cache_salt") as exc:
        client.call("count_object_prefix", bad_salt, ["a"])
    assert exc.value.code == "bad_payload"
    with pytest.raises(ServerError) as exc:
        client.call("count_object_prefix", SCOPE, [""])
    assert exc.value.code == "bad_payload"
    # Nothing was stored by the refused requests, and the server still serves.
    assert client.count_object_prefix(SCOPE, ["a"]) == 0


def test_objects_evicted_from_l1_come_back_from_disk(
    served_with_disk: tuple[MPClient, MPCacheServer],
) -> None:
    client, engine = served_with_disk
    page = 64 * 1024
    names = [f"d{i}" for i in range(2 * L1_BYTES // page)]
    for i, name in enumerate(names):
        assert client.put_objects(SCOPE, [name], [_blob(i, page)]) == [True]
    engine.storage.wait_for_puts()
    assert not engine.storage.in_l1(object_key(SCOPE, names[0]))
    assert client.count_object_prefix(SCOPE, names) == len(names)
    got = client.get_objects(SCOPE, names[:3])
    assert [bytes(v) if v is not None else None for v in got] == [_blob(i, page) for i in range(3)]


def test_object_bytes_are_counted_in_the_metrics(
    served_with_metrics: tuple[MPClient, MPCacheServer],
) -> None:
    client, engine = served_with_metrics
    assert engine.metrics is not None
    registry = engine.metrics.registry
    labels = {"transfer_mode": "objects", "sub_path": "framed"}
    client.put_objects(SCOPE, ["a", "b", "a"], [b"x" * 100, b"y" * 50, b"z"])
    client.get_objects(SCOPE, ["a", "missing"])
    assert registry.get_sample_value("lmcache_mp_stored_bytes_total", labels) == 150
    assert registry.get_sample_value("lmcache_mp_retrieved_bytes_total", labels) == 100
    ok = {"operation": "put_objects", "outcome": "ok"}
    assert registry.get_sample_value("lmcache_mp_requests_total", ok) == 1
