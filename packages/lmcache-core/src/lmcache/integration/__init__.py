"""lmcache package."""
