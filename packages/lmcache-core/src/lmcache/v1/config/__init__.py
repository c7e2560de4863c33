"""Typed engine configuration: YAML file + ``LMCACHE_<KEY>`` environment variables.

Precedence, lowest first: built-in defaults, the YAML file (an explicit path, else
``LMCACHE_CONFIG_FILE``), then ``LMCACHE_<KEY_UPPER>`` environment variables — the
environment wins.  Sizes are in GB (1024**3 bytes) as upstream, and also accept units
("10GB", "512MiB"); they are stored as GB floats.

Unknown keys are an error that names the key (with a close match when there is one),
because a misspelt ``max_local_cpu_sise`` silently falling back to a default is worse than
failing at start-up.

The config never lies about what it does: :data:`IMPLEMENTED_KEYS` is the declarative table
of the keys something in this core reads (and what reads them).  Every other accepted key
(typed upstream keys such as ``use_layerwise`` or the GDS/hugepage/lazy-allocator keys, and
the upstream-only keys for blending, P2P, PD, controller ...) loads so upstream config
files still work, but setting it logs one WARNING naming the key and saying it has no
effect here; with strict mode (``strict=True`` or ``LMCACHE_STRICT_CONFIG=1``) it is a
:class:`ConfigError` instead.  Such keys are kept in :attr:`LMCacheEngineConfig.
ignored_keys` (upstream-only ones also in ``unused_upstream_keys``).

The package holds one concept per module: the value parsers (:mod:`.parsing`), the key
table (:mod:`.keys`), checks and messages (:mod:`.validation`), the config class
(:mod:`.engine`) and :class:`LMCacheMetadata` (:mod:`.metadata`); every name this module
exported before the split is re-exported here.
"""

from lmcache.v1.config.engine import LMCacheEngineConfig
from lmcache.v1.config.keys import (
    CACHE_POLICIES,
    IMPLEMENTED_KEYS,
    NO_EFFECT_HINTS,
    REMOTE_SERDES,
    UPSTREAM_UNUSED_KEYS,
    canonical_cache_policy,
)
from lmcache.v1.config.metadata import LMCacheMetadata
from lmcache.v1.config.validation import (
    CONFIG_FILE_ENV,
    ENV_PREFIX,
    STRICT_ENV,
    ConfigError,
    config_keys,
    is_implemented,
    no_effect_message,
    strict_mode,
)

__all__ = [
    "CACHE_POLICIES",
    "canonical_cache_policy",
    "CONFIG_FILE_ENV",
    "ENV_PREFIX",
    "IMPLEMENTED_KEYS",
    "NO_EFFECT_HINTS",
    "REMOTE_SERDES",
    "STRICT_ENV",
    "UPSTREAM_UNUSED_KEYS",
    "ConfigError",
    "LMCacheEngineConfig",
    "LMCacheMetadata",
    "config_keys",
    "is_implemented",
    "no_effect_message",
    "strict_mode",
]
