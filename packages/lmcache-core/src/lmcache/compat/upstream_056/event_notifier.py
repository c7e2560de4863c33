"""Upstream's ``lmcache.v1.platform.event_notifier`` path: poll-able completion signals.

Upstream keeps its ``EventNotifier`` classes here (an eventfd where the OS has one, else a
pipe), with ``create_event_notifier``, ``consume_fd`` and the ``HAS_EVENTFD`` flag.  They
live in the product's :mod:`lmcache.v1.platform.notifiers` (the L2 adapters signal through
them).
"""

from __future__ import annotations

from lmcache.v1.platform.notifiers import (
    HAS_EVENTFD,
    EventfdNotifier,
    EventNotifier,
    PipeNotifier,
    consume_fd,
    create_event_notifier,
)

__all__ = [
    "HAS_EVENTFD",
    "EventNotifier",
    "EventfdNotifier",
    "PipeNotifier",
    "consume_fd",
    "create_event_notifier",
]
