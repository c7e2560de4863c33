"""SGLang's LMCache connector: what ``sglang --enable-lmcache`` imports (SGLang 0.5.23's
``LMCacheUnifiedRadixCache``), talking to a standalone ``lmcache server``."""
