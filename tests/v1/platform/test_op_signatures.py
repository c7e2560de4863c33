"""The static op types of ``DeviceOps`` describe exactly the torch baseline's functions."""

from __future__ import annotations

import inspect

import pytest

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.base import op_signatures
from lmcache.v1.platform.base.device_ops import DeviceOps

# DeviceOps attribute -> callback protocol type checkers use for it.
_DECLARED = {
    "multi_layer_block_kv_transfer": op_signatures.MultiLayerBlockKVTransfer,
    "multi_layer_kv_transfer": op_signatures.MultiLayerKVTransfer,
    "multi_layer_kv_transfer_unilateral": op_signatures.MultiLayerKVTransferUnilateral,
    "single_layer_kv_transfer": op_signatures.SingleLayerKVTransfer,
    "single_layer_kv_transfer_sgl": op_signatures.SingleLayerKVTransferSgl,
    "load_and_reshape_flash": op_signatures.LoadAndReshapeFlash,
    "reshape_and_cache_back_flash": op_signatures.ReshapeAndCacheBackFlash,
    "lmcache_memcpy_async": op_signatures.LmcacheMemcpyAsync,
}


def _described(signature: inspect.Signature) -> list[tuple[str, object, object, object]]:
    return [(p.name, p.kind, p.default, p.annotation) for p in signature.parameters.values()]


def test_every_protocol_is_exported() -> None:
    assert sorted(op_signatures.__all__) == sorted(p.__name__ for p in _DECLARED.values())


@pytest.mark.parametrize("name", sorted(_DECLARED))
def test_protocol_matches_the_baseline_function(name: str) -> None:
    protocol_call = inspect.signature(_DECLARED[name].__call__)
    baseline = inspect.signature(getattr(torch_ops, name))
    assert _described(protocol_call)[1:] == _described(baseline)
    assert protocol_call.return_annotation == baseline.return_annotation


@pytest.mark.parametrize("name", sorted(_DECLARED))
def test_device_ops_method_has_the_baseline_signature(name: str) -> None:
    method = inspect.signature(getattr(DeviceOps, name))
    baseline = inspect.signature(getattr(torch_ops, name))
    assert _described(method)[1:] == _described(baseline)
    assert getattr(DeviceOps, name) is getattr(DeviceOps, name)  # built once, then cached
