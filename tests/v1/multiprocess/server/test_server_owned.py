"""``python -m lmcache.v1.multiprocess.server.owned``: the server bound to an owner process.

The full path (a real server stopping cleanly when its killed owner is gone) is in
``tests/integration/vllm/test_autostart.py``; these are the owner watch and the refusals.
"""

from __future__ import annotations

import subprocess
import sys
import threading

from lmcache.v1.multiprocess.server import owned


def test_wait_for_exit_returns_when_the_process_ends() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    done = threading.Event()
    watcher = threading.Thread(target=lambda: (owned.wait_for_exit(sleeper.pid), done.set()))
    watcher.start()
    try:
        assert not done.wait(0.5)  # still running: still waiting
    finally:
        sleeper.kill()
        sleeper.wait()
    assert done.wait(10)
    watcher.join()


def test_refuses_a_missing_or_gone_owner() -> None:
    assert owned.main([]) == 2
    assert owned.main(["not-a-pid"]) == 2
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert owned.main([gone.stdout.strip(), "--port", "1"]) == 1
