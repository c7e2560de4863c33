"""Torch views of paged KV buffers for plugins: :class:`PagedLayout` and how to build one.

The public kit name of what the torch baseline itself uses (a plugin's cache context builds
the same canonical views of a worker's registered tensors), so plugins import no
``torch_ops`` module directly.
"""

from __future__ import annotations

from lmcache.v1.platform.torch_ops._kv_format import PagedLayout
from lmcache.v1.platform.torch_ops.plan import paged_layout_from_tensors

__all__ = ["PagedLayout", "paged_layout_from_tensors"]
