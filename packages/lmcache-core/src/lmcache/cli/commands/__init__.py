"""One module per ``lmcache`` sub-command; each exposes ``register(subparsers)``."""
