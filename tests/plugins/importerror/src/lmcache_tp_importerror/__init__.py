"""Registry test plugin: importerror."""

raise ImportError("lmcache_tp_importerror deliberately fails to import")
