"""``lmcache.mp.autostart``: vLLM starts a local cache server when none answers.

Every connector instance of a vLLM deployment (the scheduler's and each TP worker's, in
one or several processes) calls :func:`ensure_local_server`.  A lock file per port makes
them take turns: the first finds no server, starts one and waits until it answers; the
others then find it answering and reuse it.  A server that was already running (started
by hand, or by another vLLM) is reused and never stopped.

The started server (``python -m lmcache.v1.multiprocess.server.owned OWNER_PID --host H
--port P --http-host H ...``, our counterpart of upstream's ``python -m
lmcache.v1.multiprocess.http_server``) is detached from vLLM's process tree (double fork,
its own session): vLLM's shutdown SIGKILLs its engine's whole tree, which would leave the
server no chance to unlink its shared memory.  It stops itself (as on SIGTERM) when the
process that started it exits, however that process ends; that process also stops it
(SIGTERM, then SIGKILL) at connector shutdown or interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from lmcache.utils import process_is_running
from lmcache.v1.multiprocess.worker.client import MPClient, MPClientError
from lmcache.v1.platform.cpu.shm import SHM_DIR

logger = logging.getLogger(__name__)

LOCAL_HOSTS = ("localhost", "127.0.0.1")
# Set by autostart itself from the connector's URL.
RESERVED_ARGS = ("--host", "--port", "--http-host")
# Embedded defaults, before the user's server_args (argparse: a later flag wins).  The HTTP
# and Prometheus ports are off so an autostarted server never collides with vLLM's ports
# or a second deployment's server; the user may turn them on in server_args.
DEFAULT_SERVER_ARGS = ("--http-port", "0", "--prometheus-port", "0")
STOP_GRACE_S = 15.0
STDERR_TAIL_BYTES = 4000
_POLL_S = 0.25

SERVER_MODULE = "lmcache.v1.multiprocess.server.owned"
# Run by the direct child: fork the server into its own session (out of vLLM's process
# tree), print its pid, exit.  The server's stdout joins its log (the child's stderr).
_LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid:\n"
    "    print(pid, flush=True)\n"
    "    os._exit(0)\n"
    "os.setsid()\n"
    "os.dup2(2, 1)\n"
    "os.execv(sys.executable, [sys.executable, '-m', *sys.argv[1:]])\n"
)


def check_server_args(args: Sequence[str]) -> tuple[str, ...]:
    """``server_args`` without the flags autostart sets itself; ValueError otherwise."""
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in RESERVED_ARGS:
            raise ValueError(
                f"lmcache.mp.autostart.server_args must not contain {flag}: autostart sets "
                f"{', '.join(RESERVED_ARGS)} from lmcache.mp.host/lmcache.mp.port"
            )
    return tuple(args)


def local_host_port(url: str) -> tuple[str, int]:
    """``tcp://localhost:5555`` -> ("localhost", 5555); ValueError for a remote or odd URL."""
    parts = urlsplit(url)
    if parts.scheme != "tcp" or parts.hostname not in LOCAL_HOSTS or parts.port is None:
        raise ValueError(
            f"lmcache.mp.autostart starts a server on this machine only: the server URL must "
            f"be tcp://localhost:PORT or tcp://127.0.0.1:PORT, got {url!r}"
        )
    return parts.hostname, parts.port


def server_answers(url: str, timeout: float = 1.0) -> bool:
    try:
        with MPClient(url, timeout=timeout, connect_timeout=timeout):
            return True
    except MPClientError:
        return False


# Where the per-port lock files live: a directory every process on the machine sees the
# same whatever its $TMPDIR (two vLLMs with different TMPDIRs must still take turns).
LOCK_DIRS: tuple[str, ...] = (SHM_DIR,)


def _lock_dir() -> Path:
    for candidate in LOCK_DIRS:
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return Path(candidate)
    return Path(tempfile.gettempdir())


@contextlib.contextmanager
def _port_lock(port: int) -> Iterator[None]:
    """One starter per port and machine at a time (all vLLM processes, any $TMPDIR)."""
    path = _lock_dir() / f"lmcache-autostart-{port}.lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class AutostartedServer:
    """A server this process started; ``stop`` is idempotent and only acts in its owner."""

    def __init__(self, pid: int, url: str, log_path: Path) -> None:
        self.pid = pid  # also its process group and session id
        self.url = url
        self.log_path = log_path
        self._owner_pid = os.getpid()  # a forked child must not stop its parent's server
        atexit.register(self.stop)

    @property
    def running(self) -> bool:
        return process_is_running(self.pid)

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(self.pid) == self.pid:  # still our server, not a reused pid
                os.killpg(self.pid, signum)

    def _wait_stopped(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.running:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        if os.getpid() != self._owner_pid:
            return
        atexit.unregister(self.stop)
        if not self.running:
            return
        logger.info("stopping the autostarted LMCache server (pid %d)", self.pid)
        self._signal(signal.SIGTERM)
        if not self._wait_stopped(STOP_GRACE_S):
            logger.warning(
                "the autostarted LMCache server ignored SIGTERM for %.0f s; killing it",
                STOP_GRACE_S,
            )
            self._signal(signal.SIGKILL)
            self._wait_stopped(STOP_GRACE_S)

    def stderr_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - STDERR_TAIL_BYTES))
                return log.read().decode("utf-8", "replace")
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc})"


def _spawn(host: str, port: int, server_args: Sequence[str]) -> AutostartedServer:
    cmd = [
        sys.executable, "-c", _LAUNCHER, SERVER_MODULE, str(os.getpid()),
        "--host", host, "--port", str(port), "--http-host", host,
        *DEFAULT_SERVER_ARGS, *server_args,
    ]  # fmt: skip
    log_fd, log_name = tempfile.mkstemp(prefix=f"lmcache-autostart-{port}-", suffix=".log")
    try:
        launcher = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_fd,
            timeout=60,
            check=False,
        )
    finally:
        os.close(log_fd)
    pid_text = launcher.stdout.decode().strip()
    if launcher.returncode != 0 or not pid_text.isdigit():
        raise RuntimeError(
            f"could not launch the LMCache server (status {launcher.returncode}); see {log_name}"
        )
    pid = int(pid_text)
    logger.info(
        "autostarted an LMCache server on %s:%d (pid %d, log %s)", host, port, pid, log_name
    )
    return AutostartedServer(pid, f"tcp://{host}:{port}", Path(log_name))


def _wait_until_up(server: AutostartedServer, wait_timeout: float) -> None:
    deadline = time.monotonic() + wait_timeout
    while True:
        if not server.running:
            why = "exited"
            break
        if server_answers(server.url, timeout=min(1.0, max(0.1, deadline - time.monotonic()))):
            return
        if time.monotonic() >= deadline:
            why = f"did not answer within {wait_timeout:.1f} s (lmcache.mp.autostart.wait_timeout)"
            break
        time.sleep(_POLL_S)
    server.stop()
    raise RuntimeError(
        f"the autostarted LMCache server on {server.url} {why}; its output "
        f"({server.log_path}) ends with:\n{server.stderr_tail()}"
    )


def ensure_local_server(
    url: str, server_args: Sequence[str], wait_timeout: float
) -> AutostartedServer | None:
    """Start a server at ``url`` unless one answers; None when an existing one is reused."""
    host, port = local_host_port(url)
    args = check_server_args(server_args)
    with _port_lock(port):
        if server_answers(url):
            logger.info("lmcache.mp.autostart: reusing the LMCache server answering at %s", url)
            return None
        server = _spawn(host, port, args)
        _wait_until_up(server, wait_timeout)
    return server
