"""Compatibility homes: code that exists only so that another release's API imports here.

The rule, checked by ``lint-imports``: product code (``lmcache.v1``, ``lmcache.integration``,
``lmcache.cli``, ``lmcache.bench``) never imports ``lmcache.compat``.  Each supported
release has one sub-package (``upstream_056`` for upstream LMCache 0.5.6), and every path
that release's users import is one row of :mod:`lmcache.compat.paths`, served by the
path finder that ``import lmcache`` installs.
"""
