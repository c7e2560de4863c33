"""Upstream 0.5.6's server settings for features ``lmcache server`` lacks.

The coordinator (:mod:`.coordinator`), peer-to-peer transfer (:mod:`.p2p`) and
out-of-tree server modules (:mod:`.server_module_spec`) parse exactly as upstream's flags
do, so upstream command lines and config files still start the server; :mod:`.ignored`
logs each setting that would turn such a feature on, and refuses ``--transport grpc``.
They reach ``lmcache server`` through the ``lmcache.server_extensions`` entry point
(:mod:`.extension`), never through an import from product code.
"""
