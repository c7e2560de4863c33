"""Upstream 0.5.6's ``lmcache.v1.multiprocess.modules`` package path.

Upstream assembles its MP cache server from pluggable "modules" under this package.
lmcache-core's server is :mod:`lmcache.v1.multiprocess.server` and has no module system;
this package holds only the server-independent pieces of upstream's modules that have a
working implementation here (see :mod:`.blend`). Importing it loads nothing else.
"""
