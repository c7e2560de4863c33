"""Poll-able completion signals (``lmcache.v1.platform.notifiers``): a binary signal,
drained by ``consume`` or ``consume_fd``, on an eventfd or a pipe."""

from __future__ import annotations

import select

import pytest

from lmcache.v1.platform import consume_fd, create_event_notifier
from lmcache.v1.platform.notifiers import HAS_EVENTFD, EventfdNotifier, EventNotifier, PipeNotifier

KINDS = [PipeNotifier, *([EventfdNotifier] if HAS_EVENTFD else [])]


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


@pytest.mark.parametrize("kind", KINDS)
def test_notifications_coalesce_until_consumed(kind: type[EventNotifier]) -> None:
    with kind() as notifier:
        assert not _readable(notifier.fileno())
        notifier.notify()
        notifier.notify()
        assert _readable(notifier.fileno())
        notifier.consume()
        assert not _readable(notifier.fileno())
        notifier.consume()  # nothing pending: not an error


def test_consume_fd_drains_the_platform_notifier() -> None:
    notifier = create_event_notifier()
    try:
        notifier.notify()
        consume_fd(notifier.fileno())
        assert not _readable(notifier.fileno())
        consume_fd(notifier.fileno())
    finally:
        notifier.close()


@pytest.mark.parametrize("kind", KINDS)
def test_close_is_idempotent_and_a_closed_fd_is_an_error(kind: type[EventNotifier]) -> None:
    notifier = kind()
    fd = notifier.fileno()
    notifier.close()
    notifier.close()
    with pytest.raises(OSError):
        consume_fd(fd)
