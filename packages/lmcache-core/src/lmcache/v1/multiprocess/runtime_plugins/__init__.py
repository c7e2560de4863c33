"""Runtime plugins: side processes (Python or shell scripts) started beside ``lmcache server``.

:mod:`.launcher` runs the scripts as child processes (role and worker filters, output
logged, SIGTERM then SIGKILL on stop); :mod:`.mp_launcher` hands them the server's whole
configuration as one JSON object (secrets redacted); :mod:`.settings` holds the
``--runtime-plugin-*`` flags.  Upstream 0.5.6 names these modules
``lmcache.v1.plugin.runtime_plugin_launcher``,
``lmcache.v1.multiprocess.mp_runtime_plugin_launcher`` and
``lmcache.v1.multiprocess.runtime_plugin_config`` (rows of :mod:`lmcache.compat.paths`).
"""
