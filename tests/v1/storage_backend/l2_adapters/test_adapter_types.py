"""Adapter configs, the factory registry and the plugin loader (upstream's semantics), the
key mapping, and ``--l2-adapter`` tiers built by the storage manager."""

from __future__ import annotations

import json
import os
import sys
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import OBJ_DTYPE, expected_tensor, fill_obj, make_key

from lmcache.utils import CacheEngineKey
from lmcache.v1.storage_backend.cache_salt import configs_with_salt
from lmcache.v1.storage_backend.l2_adapters.bridge import L2AdapterBackend
from lmcache.v1.storage_backend.l2_adapters.config import (
    L2AdapterConfigBase,
    get_registered_l2_adapter_types,
    parse_adapter_spec,
    register_l2_adapter_type,
)
from lmcache.v1.storage_backend.l2_adapters.factory import (
    create_l2_adapter_from_registry,
    register_l2_adapter_factory,
)
from lmcache.v1.storage_backend.l2_adapters.keys import object_key_of
from lmcache.v1.storage_backend.l2_adapters.mock_l2_adapter import MockL2Adapter
from lmcache.v1.storage_backend.serde.backend import SerdeBackend
from lmcache.v1.storage_backend.storage_manager import StorageManager, create_storage_backends
from lmcache.v1.storage_backend.tier_settings import TierSettings

MOCK = {"type": "mock", "max_size_gb": 0.01, "mock_bandwidth_gb": 10}


def test_builtin_types_are_registered() -> None:
    assert {"mock", "plugin", "fault_inject"} <= set(get_registered_l2_adapter_types())


def test_common_keys_are_parsed() -> None:
    spec = {
        **MOCK,
        "affinity_tag": "fast",
        "shared": True,
        "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.9},
        "persist_enabled": False,
    }
    config = parse_adapter_spec(spec)
    assert config.affinity_tag == "fast" and config.shared
    assert config.eviction_config is not None
    assert config.eviction_config.trigger_watermark == 0.9
    assert config.eviction_config.eviction_ratio == 0.2
    assert not config.persist_config.persist_enabled
    assert config.serde_config is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "mock", "max_size_gb": 1}, "mock_bandwidth_gb must be a positive number"),
        ({**MOCK, "eviction": {"eviction_policy": "MRU"}}, "eviction_policy must be one of"),
        ({**MOCK, "serde": "fp8"}, "'serde' must be a dict"),
        ({**MOCK, "affinity_tag": ""}, "affinity_tag must be a non-empty string"),
        ({"type": "fault_inject", "inner": MOCK, "rate": 2}, r"rate must be a number in \[0, 1\]"),
        ({"type": "fault_inject", "inner": {"type": "fs"}}, "unknown L2 adapter type 'fs'"),
        ({"type": "plugin", "module_path": "m"}, "class_name must be a non-empty string"),
        ({"type": "nope"}, "unknown adapter type 'nope'"),
    ],
)
def test_bad_specs_are_clear_errors(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_adapter_spec(spec)


def test_registering_a_type_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_l2_adapter_type("mock", type(parse_adapter_spec(MOCK)))
    with pytest.raises(ValueError, match="already registered"):
        register_l2_adapter_factory("mock", lambda config, desc: None)  # type: ignore[arg-type,return-value]


@pytest.fixture
def plugin_module() -> Iterator[types.ModuleType]:
    """A module with an adapter class, a config class found by convention, and a
    class that is not an adapter."""
    module = types.ModuleType("fake_l2_plugin")

    class EchoConfig(L2AdapterConfigBase):
        def __init__(self, d: dict) -> None:
            self.d = d

        @classmethod
        def from_dict(cls, d: dict) -> EchoConfig:
            return cls(d)

        @classmethod
        def help(cls) -> str:
            return ""

    class Echo(MockL2Adapter):
        def __init__(self, config: Any) -> None:
            self.received = config
            super().__init__(parse_adapter_spec(MOCK))  # type: ignore[arg-type]

    module.Echo = Echo  # type: ignore[attr-defined]
    module.EchoConfig = EchoConfig  # type: ignore[attr-defined]
    module.NotAnAdapter = dict  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def _plugin(**fields: Any) -> Any:
    spec = {"type": "plugin", "module_path": "fake_l2_plugin", "class_name": "Echo", **fields}
    return create_l2_adapter_from_registry(parse_adapter_spec(spec))


def test_plugin_gets_its_config_class_built_from_adapter_params(plugin_module: Any) -> None:
    adapter = _plugin(adapter_params={"host": "h"})
    try:
        assert isinstance(adapter.received, plugin_module.EchoConfig)
        assert adapter.received.d == {"host": "h"}
    finally:
        adapter.close()


def test_plugin_without_config_class_gets_the_dict(plugin_module: Any) -> None:
    del plugin_module.EchoConfig
    adapter = _plugin(adapter_params={"a": 1})
    try:
        assert adapter.received == {"a": 1}
    finally:
        adapter.close()


def test_plugin_load_errors_name_the_problem(plugin_module: Any) -> None:
    with pytest.raises(ImportError, match="Could not import module 'no_such_mod'"):
        _plugin(module_path="no_such_mod")
    with pytest.raises(AttributeError, match="has no class 'Missing'"):
        _plugin(class_name="Missing")
    with pytest.raises(TypeError, match="is not a subclass of L2AdapterInterface"):
        _plugin(class_name="NotAnAdapter")


def test_object_keys_keep_every_part_of_identity() -> None:
    base = make_key(5)
    variants = [
        base,
        make_key(6),
        make_key(5, worker=1),
        make_key(5, model="other"),
        CacheEngineKey("org/model", 1, 0, 5, torch.bfloat16),
        CacheEngineKey("org/model", 2, 0, 5, OBJ_DTYPE),
        CacheEngineKey("org/model", 1, 0, 5, OBJ_DTYPE, {"lmcache.tag.user": "x"}),
        CacheEngineKey("org/model", 1, 0, -5, OBJ_DTYPE),
        CacheEngineKey("org/model", 1, 0, 2**200, OBJ_DTYPE),
    ]
    assert len({object_key_of(k) for k in variants}) == len(variants)
    assert object_key_of(base) == object_key_of(make_key(5))


def test_object_keys_carry_the_salt_and_survive_odd_names() -> None:
    salted = CacheEngineKey("a@b", 1, 0, 5, OBJ_DTYPE, configs_with_salt({}, "tenant/1"))
    okey = object_key_of(salted)
    assert "@" not in okey.model_name
    assert okey.cache_salt.startswith("h-")  # "/" is refused by ObjectKey: hashed
    plain = CacheEngineKey("m", 1, 0, 5, OBJ_DTYPE, configs_with_salt({}, "tenant-1"))
    assert object_key_of(plain).cache_salt == "tenant-1"


def test_storage_manager_reads_through_an_adapter_tier() -> None:
    settings = TierSettings.from_server_flags(
        chunk_size=16,
        l1_size_gb=0.001,
        eviction_policy="LRU",
        blocking_timeout_secs=1,
        l2_adapters=['{"type": "mock", "max_size_gb": 0.01, "mock_bandwidth_gb": 10}'],
    )
    backends = create_storage_backends(settings)
    manager = StorageManager(settings.config, backends=backends)
    try:
        tier = backends["L2Adapter0:mock"]
        assert isinstance(tier, L2AdapterBackend)
        obj = fill_obj(manager, 4)
        manager.batched_submit_put_task([make_key(1)], [obj])
        obj.ref_count_down()
        manager.wait_for_puts()
        assert manager.local_cpu_backend.remove(make_key(1))  # gone from L1 only
        assert manager.lookup_location(make_key(1)) == "L2Adapter0:mock"
        got = manager.get_blocking(make_key(1))
        assert got is not None and got.tensor is not None
        assert torch.equal(got.tensor, expected_tensor(4))
        got.ref_count_down()
        assert manager.in_l1(make_key(1))  # promoted
    finally:
        manager.close()


def test_an_adapter_tier_with_a_serde_stores_encoded_chunks() -> None:
    """``"serde"`` on an interface adapter wraps the bridged tier: the adapter holds the
    encoded form (aesgcm: lossless), and a read through the tier decodes it bit-exact."""
    os.environ["LMCACHE_TEST_SERDE_KEY"] = "k" * 32
    spec = {**MOCK, "serde": {"type": "aesgcm", "master_key_env": "LMCACHE_TEST_SERDE_KEY"}}
    settings = TierSettings.from_server_flags(
        chunk_size=16,
        l1_size_gb=0.001,
        eviction_policy="LRU",
        blocking_timeout_secs=1,
        l2_adapters=[json.dumps(spec)],
    )
    assert settings.adapters[0].serde is not None
    backends = create_storage_backends(settings)
    manager = StorageManager(settings.config, backends=backends)
    try:
        tier = backends["L2Adapter0:mock"]
        assert isinstance(tier, SerdeBackend) and isinstance(tier.inner, L2AdapterBackend)
        obj = fill_obj(manager, 7)
        manager.batched_submit_put_task([make_key(3)], [obj])
        obj.ref_count_down()
        manager.wait_for_puts()
        _until(lambda: tier.serialized == 1)
        assert manager.local_cpu_backend.remove(make_key(3))
        got = manager.get_blocking(make_key(3))
        assert got is not None and got.tensor is not None
        assert torch.equal(got.tensor, expected_tensor(7))
        got.ref_count_down()
        assert tier.deserialized == 1
    finally:
        manager.close()
        del os.environ["LMCACHE_TEST_SERDE_KEY"]


def _until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)
