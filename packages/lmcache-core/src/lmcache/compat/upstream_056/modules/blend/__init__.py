"""Upstream 0.5.6's CacheBlend package path (``modules.blend``): the pure parts only.

Upstream's blend module lets one request reuse KV that other requests stored for the same
text at other positions: it matches token ranges, re-rotates the cached keys to their new
positions (RoPE) and can reorder a prompt so it starts with a cached one. The server
module itself (upstream's ``BlendModule`` with its lookup, retrieve and store paths and
native retrieve plan) is **not provided** by lmcache-core. What is provided:

* :mod:`.rope` -- the re-RoPE state and per-group rotation geometry
  (``_CBRopeState``, ``_cb_group_rope_geometry``), re-exported here under upstream's names;
* :mod:`.reorder` -- the prompt reorder planner (``plan``) and its ``PromptStore``
  (import the submodule; it is not loaded by this package).

The rotation itself is ``rotary_embedding_k_fused_strided`` of the device ops
(``lmcache.device_ops``; torch baseline in :mod:`lmcache.v1.platform.torch_ops.pos_kernels`).
"""

from lmcache.compat.upstream_056.modules.blend.rope import _cb_group_rope_geometry, _CBRopeState

__all__ = ["_CBRopeState", "_cb_group_rope_geometry"]
