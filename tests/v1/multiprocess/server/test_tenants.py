"""Tenant A against tenant B (--tenants-file) on every operation, both transfer modes.

Each test names the enforcement line it covers; removing that line makes it fail.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from auth_helpers import CHUNK, GEO, KeyRing, keyed, make_keyring
from mp_server_helpers import make_kv, unlink_kv

from lmcache.v1.multiprocess.server import MPServer
from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.wire.custom_types import IPCCacheServerKey, ObjectScope
from lmcache.v1.multiprocess.worker.client import MPClient, ServerError
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

TENANTS = """
tenants:
  team-a:
    keys: [alice]
    models: [model-a, shared-model]
    salts: [a]
    shares: [public]
  team-b:
    keys: [bob]
    salts: [b]
    salt_prefix: "b-"
  publisher:
    keys: [publisher]
    salts: [public]
    admin: true
"""
MODES = [("engine_driven", "inline"), ("lmcache_driven", None)]
PROMPT = list(range(100, 100 + 2 * CHUNK))


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> KeyRing:
    root = tmp_path_factory.mktemp("tenant-keys")
    ring = make_keyring(root, ("alice", "bob", "publisher"))
    (root / "tenants.yaml").write_text(TENANTS)
    return ring


@pytest.fixture(scope="module")
def served(ring: KeyRing) -> Iterator[tuple[MPServer, MPCacheServer]]:
    with keyed(ring, tenants_file=str(ring.root / "tenants.yaml"), enable_admin_ops=True) as pair:
        yield pair


class Workers:
    """KV caches and workers of the test, closed (and unlinked) at the end."""

    def __init__(self, ring: KeyRing, url: str) -> None:
        self.ring, self.url = ring, url
        self.made: list[tuple[KVCacheWorker, list[torch.Tensor], bool]] = []

    def __call__(
        self, who: str, mode: str = "engine_driven", sub: str | None = "inline", **kw: Any
    ) -> KVCacheWorker:
        shm = mode == "lmcache_driven"
        kv = make_kv(shm=shm, seed=len(self.made), **GEO)
        args = {"model_name": "shared-model", "mode": mode, "sub_path": sub} | kw
        worker = KVCacheWorker(kv, server_url=self.url, curve=self.ring.client(who), **args)
        self.made.append((worker, kv, shm))
        return worker

    def kv_of(self, worker: KVCacheWorker) -> list[torch.Tensor]:
        return next(kv for w, kv, _shm in self.made if w is worker)

    def close(self) -> None:
        for worker, kv, shm in self.made:
            worker.close()
            if shm:
                unlink_kv(kv)


@pytest.fixture
def workers(ring: KeyRing, served: tuple[MPServer, MPCacheServer]) -> Iterator[Workers]:
    made = Workers(ring, served[0].endpoint)
    yield made
    made.close()


def _client(ring: KeyRing, served: tuple[MPServer, MPCacheServer], who: str) -> MPClient:
    return MPClient(served[0].endpoint, timeout=10, curve=ring.client(who))


def _key(salt: str = "", model: str = "shared-model", rid: str = "r") -> IPCCacheServerKey:
    return IPCCacheServerKey.from_token_ids(model, 1, None, PROMPT, request_id=rid, cache_salt=salt)


def _forbidden(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ServerError) as info:
        call(*args, **kwargs)
    assert info.value.code == "forbidden", info.value
    return info.value.message


def _tokens(prompt: list[int], offset: int) -> list[int]:
    return [t + offset for t in prompt]


# -- read --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "sub"), MODES)
def test_a_cannot_read_bs_chunks(workers: Workers, mode: str, sub: str | None) -> None:
    """state._admit_key (the read check) and the default salt of salt-less keys."""
    prompt = _tokens(PROMPT, 1000 * len(mode))
    b, a = workers("bob", mode, sub), workers("alice", mode, sub)
    assert b.store(prompt, list(range(8)))
    assert b.lookup(prompt) == len(prompt)
    # The same prompt without a salt: A's default salt, other hashes -> a miss.
    assert a.lookup(prompt) == 0
    assert not a.retrieve(prompt, list(range(8, 16)))
    # Naming B's salt is refused outright.
    _forbidden(a.lookup, prompt, cache_salt="b")
    _forbidden(a.retrieve, prompt, list(range(8, 16)), cache_salt="b")
    _forbidden(a.retrieve, prompt, list(range(8, 16)), cache_salt="b-x")


def test_lookup_refusal_does_not_depend_on_what_is_cached(workers: Workers) -> None:
    """Refused before storage is consulted: same reply for a cached and an uncached prefix."""
    b, a = workers("bob"), workers("alice")
    cached, absent = _tokens(PROMPT, 5000), _tokens(PROMPT, 6000)
    assert b.store(cached, list(range(8)))
    assert _forbidden(a.lookup, cached, cache_salt="b") == _forbidden(
        a.lookup, absent, cache_salt="b"
    )


# -- write -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "sub"), MODES)
def test_a_cannot_plant_chunks_under_bs_salt(workers: Workers, mode: str, sub: str | None) -> None:
    """state._admit_key (the write check)."""
    prompt = _tokens(PROMPT, 2000 * len(mode))
    a, b = workers("alice", mode, sub), workers("bob", mode, sub)
    _forbidden(a.store, prompt, list(range(8)), cache_salt="b")
    _forbidden(a.store, prompt, list(range(8)), cache_salt="b-sub")
    assert b.lookup(prompt) == 0
    assert b.lookup(prompt, cache_salt="b-sub") == 0


def test_shares_are_read_only(workers: Workers) -> None:
    """Tenant.may_read (shares) against Tenant.owns (writes)."""
    pub, a, b = workers("publisher"), workers("alice"), workers("bob")
    prompt = _tokens(PROMPT, 7000)
    assert pub.store(prompt, list(range(8)))  # default salt "public"
    assert a.lookup(prompt, cache_salt="public") == len(prompt)
    assert a.retrieve(prompt, list(range(8, 16)), cache_salt="public")
    for got, want in zip(workers.kv_of(a), workers.kv_of(pub)):
        assert torch.equal(got[:, 8:16], want[:, :8])
    _forbidden(a.store, _tokens(PROMPT, 7500), list(range(8)), cache_salt="public")
    _forbidden(b.lookup, prompt, cache_salt="public")  # not B's share


def test_model_outside_the_tenants_list_is_refused(
    ring: KeyRing, served: tuple[MPServer, MPCacheServer], workers: Workers
) -> None:
    """state._check_model, at registration and on keys."""
    with pytest.raises(ServerError, match="forbidden"):
        workers("alice", model_name="model-b")
    with _client(ring, served, "alice") as client:
        _forbidden(client.lookup, _key(model="model-b"), 1)


# -- workers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "sub"), MODES)
def test_a_cannot_take_over_or_drop_bs_instance_id(
    ring: KeyRing,
    served: tuple[MPServer, MPCacheServer],
    workers: Workers,
    mode: str,
    sub: str | None,
) -> None:
    """workers._check_registration / _replace_worker, _worker, _drop_worker and ping."""
    b = workers("bob", mode, sub)
    prompt = _tokens(PROMPT, 3000 * len(mode))
    with pytest.raises(ServerError, match="take over"):
        workers("alice", mode, sub, instance_id=b.instance_id)
    with _client(ring, served, "alice") as client:
        assert client.ping(b.instance_id) is False
        unregister = (
            "unregister_kv_cache"
            if mode == "lmcache_driven"
            else "unregister_kv_cache_engine_driven_context"
        )
        client.call(unregister, b.instance_id)
        # Using B's id for a transfer: as if it did not exist.
        worker_key = IPCCacheServerKey.from_token_ids("shared-model", 1, 0, prompt)
        with pytest.raises(ServerError, match="unknown_worker"):
            if mode == "engine_driven":
                client.call("prepare_store", worker_key, b.instance_id)
            else:
                client.call("store", worker_key, b.instance_id, [list(range(8))], b"")
    with _client(ring, served, "bob") as client:
        assert client.ping(b.instance_id) is True
    assert b.store(prompt, list(range(8)))


# -- sessions and prefetch -----------------------------------------------------------------------


def test_lookup_sessions_and_prefetch_status_are_per_tenant(
    ring: KeyRing, served: tuple[MPServer, MPCacheServer], workers: Workers
) -> None:
    """state._session_id."""
    b = workers("bob")
    prompt = _tokens(PROMPT, 8000)
    assert b.store(prompt, list(range(8)))
    key = IPCCacheServerKey.from_token_ids("shared-model", 1, None, prompt, request_id="req-1")
    with _client(ring, served, "bob") as bob, _client(ring, served, "alice") as alice:
        bob.lookup(key, 1)
        assert alice.query_prefetch_status("req-1") is None
        assert alice.call("query_prefetch_progress", "req-1") is None
        alice.end_session("req-1")  # must not end B's session
        assert bob.query_prefetch_status("req-1") == 2
        bob.end_session("req-1")


# -- events, stats, admin ------------------------------------------------------------------------


def test_kv_events_show_only_readable_salts(
    ring: KeyRing, served: tuple[MPServer, MPCacheServer], workers: Workers
) -> None:
    """admin.subscribe_kv_events (visible=tenant.may_read)."""
    b, pub = workers("bob", model_name="ev-model"), workers("publisher", model_name="ev-model")
    with pytest.raises(ServerError, match="forbidden"):
        workers("alice", model_name="ev-model")
    assert b.store(_tokens(PROMPT, 9000), list(range(8)))
    assert pub.store(_tokens(PROMPT, 9500), list(range(8)))
    with _client(ring, served, "bob") as bob:
        mine = bob.call("subscribe_kv_events", 1, "ev-model", 0, 1024).events
    with _client(ring, served, "publisher") as publisher:
        public = publisher.call("subscribe_kv_events", 1, "ev-model", 0, 1024).events
    assert len(mine) == 2 and len(public) == 2
    assert not {bytes(h) for r in mine for h in r.block_hashes} & {
        bytes(h) for r in public for h in r.block_hashes
    }
    with _client(ring, served, "alice") as alice:
        _forbidden(alice.call, "subscribe_kv_events", 1, "ev-model", 0, 1024)
        shared = alice.call("subscribe_kv_events", 1, "shared-model", 0, 1024).events
    # A sees shared-model events of its own salt and its share only: none of B's.
    with _client(ring, served, "bob") as bob:
        bobs = bob.call("subscribe_kv_events", 1, "shared-model", 0, 1024).events
    assert bobs and not {r.seq for r in shared} & {r.seq for r in bobs}


def test_stats_show_a_tenant_nothing_of_the_others(
    ring: KeyRing, served: tuple[MPServer, MPCacheServer], workers: Workers
) -> None:
    """admin.get_stats for tenants."""
    assert workers("bob").store(_tokens(PROMPT, 11000), list(range(8)))
    with _client(ring, served, "alice") as alice:
        stats = alice.get_stats()
    assert stats.stored_tokens == 0 and stats.l1_used_bytes == 0 and stats.shm_name == ""
    assert stats.chunk_size == CHUNK


def test_clear_needs_an_admin_tenant(
    ring: KeyRing, served: tuple[MPServer, MPCacheServer], workers: Workers
) -> None:
    """admin.authorize_admin for tenants."""
    b = workers("bob")
    prompt = _tokens(PROMPT, 12000)
    assert b.store(prompt, list(range(8)))
    with _client(ring, served, "alice") as alice:
        _forbidden(alice.call, "clear", False, None)
    assert b.lookup(prompt) == len(prompt)


def test_tenants_get_no_shared_memory(workers: Workers) -> None:
    """engine_driven: L1's segment is never offered to a tenant (it holds every tenant)."""
    a = workers("alice", sub=None)
    assert a.sub_path == "inline"
    with pytest.raises(Exception, match=r"(?i)shm|shared memory"):
        workers("alice", sub="shm")


def test_per_tenant_metrics(served: tuple[MPServer, MPCacheServer], workers: Workers) -> None:
    a = workers("alice")
    assert a.store(_tokens(PROMPT, 13000), list(range(8)))
    _forbidden(a.lookup, PROMPT, cache_salt="b")
    metrics = served[1].metrics
    assert metrics is not None
    text = metrics.exposition().decode()
    forbidden = r'lmcache_mp_tenant_requests_total\{outcome="forbidden",tenant="team-a"\}'
    stored = r'lmcache_mp_tenant_bytes_total\{direction="stored",tenant="team-a"\}'
    assert re.search(forbidden, text) and re.search(stored, text)


def test_a_cannot_register_bs_kv_memory(workers: Workers) -> None:
    """workers._check_segments_free: B's KV pages, registered by A, would be A's to read."""
    b = workers("bob", "lmcache_driven", None)
    with pytest.raises(ServerError, match="another tenant's KV memory"):
        KVCacheWorker(
            workers.kv_of(b),
            model_name="shared-model",
            server_url=workers.url,
            mode="lmcache_driven",
            curve=workers.ring.client("alice"),
        )
    assert b.store(_tokens(PROMPT, 14000), list(range(8)))


# -- named objects (HiCache pages) ---------------------------------------------------------


def test_named_objects_follow_the_tenant_rules(
    ring: KeyRing, served: tuple[MPServer, MPCacheServer]
) -> None:
    """state._admit_scope: put needs an owned salt, get and count a readable one, the model
    must be the tenant's, and a scope without a salt is the tenant's default salt."""

    def scope(salt: str, model: str = "shared-model") -> ObjectScope:
        return ObjectScope(model, 1, 0, salt, "pages")

    page = bytes(range(64))
    with _client(ring, served, "bob") as bob, _client(ring, served, "alice") as alice:
        assert bob.put_objects(scope("b"), ["p1"], [page]) == [True]
        _forbidden(alice.put_objects, scope("b"), ["p2"], [page])  # plant
        _forbidden(alice.get_objects, scope("b"), ["p1"])  # read
        _forbidden(alice.count_object_prefix, scope("b"), ["p1"])  # existence
        _forbidden(alice.put_objects, scope("a", "model-x"), ["p1"], [page])  # model
        # Alice without a salt: her default salt, where bob's page does not exist.
        assert alice.count_object_prefix(scope(""), ["p1"]) == 0
        assert alice.put_objects(scope(""), ["p1"], [page]) == [True]
        assert alice.count_object_prefix(scope("a"), ["p1"]) == 1
        got = bob.get_objects(scope("b"), ["p1"])[0]
        assert got is not None and bytes(got) == page
