"""A storage key carries its tenant's ``cache_salt`` without the salt changing its identity."""

from __future__ import annotations

import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.storage_backend.cache_salt import CACHE_SALT_CONFIG, configs_with_salt, salt_of


def _key(configs: dict[str, str] | None) -> CacheEngineKey:
    return CacheEngineKey("org/model", 1, 0, 42, torch.half, configs)


def test_salt_rides_along_outside_the_key_identity() -> None:
    salted = _key(configs_with_salt({"lmcache.tag.user": "a"}, "tenant-a"))
    assert salt_of(salted) == "tenant-a"
    assert salted.request_configs == {"lmcache.tag.user": "a", CACHE_SALT_CONFIG: "tenant-a"}
    plain = _key({"lmcache.tag.user": "a"})
    assert salt_of(plain) == ""
    # Same chunk hash and tags: the same key (the salt is already in the chunk hash).
    assert salted == plain and hash(salted) == hash(plain)
    assert salted.to_string() == plain.to_string()


def test_unsalted_keys_gain_no_entry_and_inputs_are_not_mutated() -> None:
    original = {"x": 1}
    assert configs_with_salt(original, "") == {"x": 1}
    assert configs_with_salt(None, "") == {}
    configs_with_salt(original, "s")
    assert original == {"x": 1}
    assert salt_of(_key(None)) == ""
