"""Upstream LMCache 0.5.6's ``lmcache.v1.utils`` package (helpers of its v1 modules).

Only :mod:`.router_discovery` is provided.  Not to be confused with the top-level
:mod:`lmcache.utils`.
"""
