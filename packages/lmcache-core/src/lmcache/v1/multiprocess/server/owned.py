"""``python -m lmcache.v1.multiprocess.server.owned OWNER_PID [server flags]``.

The cache server, bound to the lifetime of another process: when ``OWNER_PID`` exits, the
server stops as on SIGTERM (draining, and unlinking its shared memory).  vLLM's connector
autostart (``lmcache.mp.autostart``) runs it this way: the server lives outside vLLM's
process tree, so vLLM's shutdown (which SIGKILLs its engine's whole tree, leaving no chance
to clean up) cannot reach it, and it still ends with the vLLM process that started it.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import threading
import time

from lmcache.utils import process_is_running

logger = logging.getLogger(__name__)

_POLL_S = 1.0


def wait_for_exit(pid: int) -> None:
    """Returns once ``pid`` has exited (pidfd where the kernel has it, polling otherwise)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        while process_is_running(pid):
            time.sleep(_POLL_S)
        return
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll(None):
            pass
    finally:
        os.close(fd)


def _stop_when_owner_exits(owner: int) -> None:
    wait_for_exit(owner)
    logger.info("the process that started this server (pid %d) exited; stopping", owner)
    # The server's SIGTERM handler runs the clean shutdown on the main thread.
    os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or not args[0].isdigit():
        sys.stderr.write("usage: python -m lmcache.v1.multiprocess.server.owned OWNER_PID ...\n")
        return 2
    owner = int(args[0])
    if not process_is_running(owner):
        sys.stderr.write(f"lmcache server: the owner process {owner} is gone; not starting\n")
        return 1
    from lmcache.v1.multiprocess.server.run import main as server_main

    watcher = threading.Thread(
        target=_stop_when_owner_exits, args=(owner,), name="lmcache-owner-watch", daemon=True
    )
    watcher.start()
    return server_main(args[1:])


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
