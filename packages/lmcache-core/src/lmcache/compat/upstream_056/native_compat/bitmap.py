"""Upstream's ``lmcache_native.Bitmap``: the product class of the L2 adapter interface.

An L2 adapter answers lookups and loads with a bitmap, so the class is public product API
(:mod:`lmcache.v1.storage_backend.l2_adapters.bitmap`); this module keeps its earlier
compatibility path.
"""

from lmcache.v1.storage_backend.l2_adapters.bitmap import Bitmap

__all__ = ["Bitmap"]
