"""Upstream 0.5.6's ``group_view`` helpers and the ``EngineGroupInfo`` wire type."""

from __future__ import annotations

import msgspec
import pytest

from lmcache.compat.upstream_056.group_view import (
    EXCLUDED_ENGINE_GROUP,
    EngineGroupInfo,
    engine_group_layer_indices,
    expand_engine_block_ids,
    get_engine_group_indices,
    num_engine_group_infos,
    num_engine_groups,
    slice_block_ids_per_group,
)
from lmcache.v1.multiprocess import custom_types
from lmcache.v1.multiprocess.wire.protocol import wire_decoder, wire_encoder
from lmcache.v1.platform.kv_wrap import KVCache

# Engine group 0 split in two by geometry, plus engine group 1.
GROUPS = [
    EngineGroupInfo(0, (0, 2), tokens_per_block=16),
    EngineGroupInfo(1, (1,), tokens_per_block=64, sw_size_tokens=128),
    EngineGroupInfo(0, (3,), tokens_per_block=16),
]


def test_defaults_and_upstream_path_names() -> None:
    info = EngineGroupInfo(2)
    assert (info.layer_indices, info.tokens_per_block, info.sw_size_tokens) == ((), 0, -1)
    assert (info.extra_object_group_tag, info.recurrent_state) == (0, False)
    assert custom_types.KVCache is KVCache
    assert "KVCache" in custom_types.__all__
    with pytest.raises(AttributeError):
        info.engine_group_id = 3  # type: ignore[misc]


def test_wire_round_trip_and_bounds() -> None:
    data = wire_encoder().encode(GROUPS)
    assert wire_decoder(list[EngineGroupInfo]).decode(data) == GROUPS
    # An old payload with only the id decodes; an out-of-range layer does not.
    old = msgspec.msgpack.encode([{"engine_group_id": 1}])
    assert wire_decoder(list[EngineGroupInfo]).decode(old) == [EngineGroupInfo(1)]
    bad = msgspec.msgpack.encode([{"engine_group_id": 0, "layer_indices": [-1]}])
    with pytest.raises(msgspec.ValidationError):
        wire_decoder(list[EngineGroupInfo]).decode(bad)


def test_counts_and_layer_indices() -> None:
    assert (num_engine_groups(GROUPS), num_engine_group_infos(GROUPS)) == (2, 3)
    assert (num_engine_groups([]), num_engine_group_infos([])) == (1, 1)
    assert engine_group_layer_indices(GROUPS) == [[0, 2, 3], [1]]
    assert engine_group_layer_indices([]) == []


def test_expand_engine_block_ids() -> None:
    assert expand_engine_block_ids(GROUPS, [[1, 2], [9]]) == [[1, 2], [9], [1, 2]]
    # Single-group connectors send a flat list.
    assert expand_engine_block_ids([], [4, 5]) == [[4, 5]]
    assert expand_engine_block_ids([EngineGroupInfo(0)], []) == [[]]


def test_slice_block_ids_per_group() -> None:
    ids = {0: list(range(10, 26)), 1: [7, 8, 9, 10]}
    assert slice_block_ids_per_group(ids, [16, 64, 0], 64, 128) == [
        [14, 15, 16, 17],
        [8],
        [],
    ]
    with pytest.raises(ValueError, match="not aligned"):
        slice_block_ids_per_group(ids, [16, 64], 16, 64)


def test_get_engine_group_indices() -> None:
    assert get_engine_group_indices(GROUPS, 5) == [0, 1, 0, 0, EXCLUDED_ENGINE_GROUP]
    assert get_engine_group_indices([], 5) is None
    assert get_engine_group_indices(GROUPS, 0) is None
    with pytest.raises(ValueError, match="outside"):
        get_engine_group_indices(GROUPS, 3)
