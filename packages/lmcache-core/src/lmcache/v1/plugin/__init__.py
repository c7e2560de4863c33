"""Runtime plugins: side processes (Python or shell scripts) started next to LMCache.

Upstream LMCache 0.5.6's ``lmcache.v1.plugin`` package; see
:mod:`lmcache.v1.plugin.runtime_plugin_launcher`.
"""
