"""Interfaces a device backend implements: import these directly from their modules.

Importing this package must stay cheap and side-effect free because entry-point plugin
modules import ``lmcache.v1.platform.base.device_spec`` while the registry is being built.
"""
