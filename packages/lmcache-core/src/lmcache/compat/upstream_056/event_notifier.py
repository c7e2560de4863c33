"""Upstream's ``lmcache.v1.platform.event_notifier`` path: the eventfd capability flag.

Upstream keeps its poll-able ``EventNotifier`` classes here, and ``HAS_EVENTFD`` with
them, which callers of the periodic notifier read to choose ``use_eventfd`` (an eventfd
where the OS has one, else a pipe).  Only the flag is provided: lmcache-core's server
does its own fd signalling.
"""

from __future__ import annotations

from lmcache.v1.platform import HAS_EVENTFD

__all__ = ["HAS_EVENTFD"]
