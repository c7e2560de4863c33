"""An ``MPClient`` dropped without ``close()`` releases its socket and context."""

from __future__ import annotations

from typing import Any

from lmcache.v1.multiprocess.worker.client import MPClient, free_url


def test_a_dropped_client_closes_its_socket_and_terminates_its_context() -> None:
    # Without the finalizer a dropped client left its context open; in a reference cycle the
    # collector then finalized the context first and its term() blocked forever on the
    # still-open socket, in whichever thread ran the collection.  (The cycle itself is not
    # built here: a global gc.collect() would also run every other test's leftovers.)
    client: Any = MPClient(free_url(), timeout=1, handshake=False)
    context, sock = client._ctx, client._sock
    del client  # the last reference: the finalizer runs now
    assert sock.closed
    assert context.closed


def test_close_and_the_finalizer_release_once() -> None:
    client = MPClient(free_url(), timeout=1, handshake=False)
    context = client._ctx
    client.close()
    client.close()
    assert context.closed
    del client  # nothing left to release: no second term()
