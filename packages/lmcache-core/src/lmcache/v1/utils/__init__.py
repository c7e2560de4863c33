"""Upstream LMCache 0.5.6's ``lmcache.v1.utils`` package (helpers of its v1 modules).

Provided: :mod:`.router_discovery` and :mod:`.json_utils`.  Not to be confused with the
top-level :mod:`lmcache.utils`.
"""
