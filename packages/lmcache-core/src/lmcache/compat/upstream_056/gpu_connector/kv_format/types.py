"""Upstream LMCache 0.5.6's ``kv_format.types``: the KV-cache structure the format layer
reads and the registration hints a serving engine may pass with it.

``LayoutHints`` is a ``TypedDict``, so an engine may just as well send a plain ``dict``;
the wire protocol carries it as one (``register_kv_cache``'s ``layout_hints``).
"""

from __future__ import annotations

from typing import Literal, TypeAlias, TypedDict, get_args

import torch

__all__ = ["KV_LAYOUT_NAMES", "DiscoverableKVCache", "KVLayoutName", "LayoutHints"]

# A single tensor (cross-layer caches) or a (possibly nested) list of them: per-layer
# lists, SGLang's [K layers, V layers], per-layer tuples of planes.
DiscoverableKVCache: TypeAlias = torch.Tensor | list["DiscoverableKVCache"]

KVLayoutName = Literal["NHD", "HND", "BLHNC", "BLNHC"]
KV_LAYOUT_NAMES: tuple[str, ...] = get_args(KVLayoutName)


class LayoutHints(TypedDict, total=False):
    """Registration hints from a serving engine (every key optional).

    Keys:
        kv_layout: physical order of a layer's axes -- ``"NHD"`` (heads after the block
            slots), ``"HND"`` (heads first) or vLLM's blocks-outermost ``"BLHNC"`` /
            ``"BLNHC"``.
        num_kv_heads: KV heads per layer (lets a flat pool be re-viewed per head).
        tokens_per_block: tokens in one paged block (splits a fused ``NB*BS`` axis).
        kv_list_layout: SGLang's outer list: ``"k_v"`` (K layers then V layers) or
            ``"unified"`` (one zero-copy view per component).
        head_dim: per-head width.
    """

    kv_layout: KVLayoutName
    num_kv_heads: int
    tokens_per_block: int
    kv_list_layout: Literal["k_v", "unified"]
    head_dim: int
