"""Upstream LMCache 0.5.6's ``lmcache.v1.plugin`` package path.

Its one module, ``runtime_plugin_launcher``, is product code here:
:mod:`lmcache.v1.multiprocess.runtime_plugins.launcher` (a row of
:mod:`lmcache.compat.paths`).
"""
