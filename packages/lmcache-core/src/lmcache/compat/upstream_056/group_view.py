"""Upstream LMCache 0.5.6's ``lmcache.v1.multiprocess.group_view``: an engine's KV-cache
groups, described engine-neutrally.

An *engine group* is one paged-block address space of the serving engine (one of vLLM's
hybrid KV-cache groups, say): a block id means something only inside its group. The
description is a ``list[EngineGroupInfo]`` in protocol order -- the order of the block-id
lists of store and retrieve requests. An empty list means one plain (non-hybrid) group.
Engine group ids are dense from 0.

:class:`EngineGroupInfo` is a wire type (:mod:`lmcache.v1.multiprocess.wire.custom_types`).
lmcache-core's MP server currently moves one KV group per worker and does not read these
infos; the helpers here are pure functions for code written against upstream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lmcache.v1.multiprocess.wire.custom_types import EngineGroupInfo

__all__ = [
    "EXCLUDED_ENGINE_GROUP",
    "EngineGroupInfo",
    "engine_group_layer_indices",
    "expand_engine_block_ids",
    "get_engine_group_indices",
    "num_engine_group_infos",
    "num_engine_groups",
    "slice_block_ids_per_group",
]

# Marks a registered tensor no group references (a KV-sharing layer that reads another
# layer's cache); grouping skips it. Upstream's value.
EXCLUDED_ENGINE_GROUP = -1


def num_engine_groups(groups: Sequence[EngineGroupInfo]) -> int:
    """Block-id lists a transfer request carries: ``max(engine_group_id) + 1`` (1 if none)."""
    return 1 + max((g.engine_group_id for g in groups), default=0)


def num_engine_group_infos(groups: Sequence[EngineGroupInfo]) -> int:
    """LMCache KV groups of the registration: ``len(groups)``, or 1 for the plain case."""
    return len(groups) or 1


def engine_group_layer_indices(groups: Sequence[EngineGroupInfo]) -> list[list[int]]:
    """Sorted layer indices per engine group id (infos sharing an id are merged); empty
    for the plain case."""
    if not groups:
        return []
    merged: list[list[int]] = [[] for _ in range(num_engine_groups(groups))]
    for group in groups:
        merged[group.engine_group_id] += group.layer_indices
    return [sorted(layers) for layers in merged]


def expand_engine_block_ids(
    groups: Sequence[EngineGroupInfo],
    engine_side_block_ids: Sequence[Sequence[int]] | Sequence[int],
) -> list[list[int]]:
    """The engine's block ids (one list per engine group) re-indexed by LMCache group.

    A flat ``list[int]`` -- what single-group connectors send -- is engine group 0's list.
    """
    per_engine_group: list[list[int]]
    if not engine_side_block_ids or isinstance(engine_side_block_ids[0], int):
        per_engine_group = [[int(b) for b in engine_side_block_ids]]  # type: ignore[arg-type]
    else:
        per_engine_group = [list(ids) for ids in engine_side_block_ids]  # type: ignore[arg-type]
    sources = [g.engine_group_id for g in groups] or [0]
    return [list(per_engine_group[source]) for source in sources]


def slice_block_ids_per_group(
    allocated_block_ids: Mapping[int, Sequence[int]],
    group_tokens_per_block: Sequence[int],
    start_token_idx: int,
    end_token_idx: int,
) -> list[list[int]]:
    """Each engine group's block ids covering tokens ``[start, end)``.

    A group of ``tokens_per_block`` tokens per block holds one id per that many tokens; a
    ``tokens_per_block`` of 0 marks a scratch group (empty slice).

    Raises:
        ValueError: a range end is not on a block boundary of some group.
    """
    out: list[list[int]] = []
    for group_idx, per_block in enumerate(group_tokens_per_block):
        if per_block == 0:
            out.append([])
            continue
        if start_token_idx % per_block or end_token_idx % per_block:
            raise ValueError(
                f"token range [{start_token_idx}, {end_token_idx}) is not aligned to "
                f"engine group {group_idx}'s {per_block} tokens per block"
            )
        ids = allocated_block_ids.get(group_idx, [])
        out.append(list(ids[start_token_idx // per_block : end_token_idx // per_block]))
    return out


def get_engine_group_indices(
    groups: Sequence[EngineGroupInfo], num_registered_layers: int
) -> list[int] | None:
    """The engine group of each registered tensor (:data:`EXCLUDED_ENGINE_GROUP` for one no
    group names), or None without group metadata or layers.

    Raises:
        ValueError: a group names a layer outside ``[0, num_registered_layers)``.
    """
    if not groups or num_registered_layers == 0:
        return None
    owner = [EXCLUDED_ENGINE_GROUP] * num_registered_layers
    for group in groups:
        for layer in group.layer_indices:
            if not 0 <= layer < num_registered_layers:
                raise ValueError(
                    f"engine group {group.engine_group_id} names layer {layer}, outside "
                    f"the {num_registered_layers} registered layers"
                )
            owner[layer] = group.engine_group_id
    return owner
