"""Upstream's ``lmcache.v1.mp_coordinator``: only its key encoding (``utils.encoding``),
which upstream's eviction-policy checkpoints use.  Upstream's coordinator service itself
is not provided."""
