"""The ``lmcache`` command line."""
