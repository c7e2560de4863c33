"""Upstream's ``lmcache.v1.mp_coordinator.utils`` (only ``encoding``)."""
