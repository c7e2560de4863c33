"""Upstream's eviction-policy interface over the product policies: batch order, reserved
writes, ghosts only for reported evictions, isolation by salt, and the factory."""

from __future__ import annotations

import pytest

from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.eviction import L1EvictionPolicy
from lmcache.v1.distributed.eviction_policy import (
    ARCEvictionPolicy,
    CreateEvictionPolicy,
    IsolatedLRUEvictionPolicy,
    LRUEvictionPolicy,
    NoOpEvictionPolicy,
)
from lmcache.v1.distributed.internal_api import EvictionDestination


def _key(i: int, salt: str = "") -> ObjectKey:
    return ObjectKey(ObjectKey.IntHash2Bytes(i), "m", 0, cache_salt=salt)


def test_a_batch_evicts_its_last_chunk_first() -> None:
    policy = LRUEvictionPolicy()
    policy.on_keys_created([_key(1), _key(2), _key(3)])
    assert policy.get_eviction_actions(0.34)[0].keys == [_key(3)]


def test_arc_ghost_only_for_a_reported_victim() -> None:
    policy = ARCEvictionPolicy()
    policy.on_keys_created([_key(1)])
    policy.on_keys_created([_key(2)])
    victims = policy.get_eviction_actions(0.5)[0].keys
    assert victims == [_key(1)]
    assert policy.get_num_tracked_keys() == 2  # chosen is not removed
    policy.on_keys_removed(victims)
    assert policy.get_debug_state()["b1"] == [_key(1)]
    policy.on_keys_removed([_key(2)])  # an explicit removal: forgotten, no ghost
    assert policy.get_debug_state()["b1"] == [_key(1)]
    assert _key(2) not in policy.get_debug_state()["t1"]


def test_arc_reserved_write_is_one_reference() -> None:
    policy = ARCEvictionPolicy()
    listener = L1EvictionPolicy(policy)
    listener.on_l1_keys_reserved_write([_key(1), _key(2)])
    listener.on_l1_keys_write_finished([_key(1), _key(2)])
    state = policy.get_debug_state()
    assert state["t1"] == [_key(2), _key(1)] and state["t2"] == []


def test_isolated_lru_evicts_within_the_named_salt_only() -> None:
    policy = IsolatedLRUEvictionPolicy()
    policy.on_keys_created([_key(1, "a"), _key(2, "b"), _key(3, "a")])
    assert policy.support_isolation
    keys = policy.get_eviction_actions(1.0, cache_salt="a")[0].keys
    assert {k.cache_salt for k in keys} == {"a"} and len(keys) == 2
    with pytest.raises(ValueError, match="cache_salt"):
        policy.get_eviction_actions(0.5)


def test_noop_never_answers_and_factory_knows_every_name() -> None:
    policy = NoOpEvictionPolicy()
    policy.on_keys_created([_key(1)])
    assert policy.get_eviction_actions(1.0) == []
    for name, kind in [
        ("LRU", LRUEvictionPolicy),
        ("ARC", ARCEvictionPolicy),
        ("IsolatedLRU", IsolatedLRUEvictionPolicy),
        ("noop", NoOpEvictionPolicy),
    ]:
        config = type("EvictionConfig", (), {"eviction_policy": name})()
        assert isinstance(CreateEvictionPolicy(config), kind)
    with pytest.raises(ValueError, match="Unsupported"):
        CreateEvictionPolicy(type("C", (), {"eviction_policy": "lru"})())
    fifo = CreateEvictionPolicy(type("C", (), {"eviction_policy": "FIFO"})())
    fifo.register_eviction_destination(EvictionDestination.L2_CACHE)
    fifo.on_keys_created([_key(1)])
    assert fifo.get_eviction_actions(1.0)[0].destination is EvictionDestination.L2_CACHE
