"""``lmcache.mp.autostart``: a real server is started, reused, and gone after ``stop``.

Needs no vLLM (the autostart module does not import it); the connector-level case is in
``test_connector_vllm.py``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from lmcache.integration.vllm import autostart
from lmcache.integration.vllm.autostart import (
    check_server_args,
    ensure_local_server,
    local_host_port,
    server_answers,
)
from lmcache.integration.vllm.mp_config import parse_extra_config
from lmcache.utils import process_is_running

SMALL_SERVER = ("--l1-size-gb", "0.05")


@pytest.fixture(autouse=True)
def _private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lock and log files go to the test's folder, not the machine's /tmp or /dev/shm."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(autostart, "LOCK_DIRS", (str(tmp_path / "locks"),))
    (tmp_path / "locks").mkdir()


def test_the_port_lock_ignores_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes with different $TMPDIR take the same lock file."""
    first = autostart._lock_dir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    assert autostart._lock_dir() == first == tmp_path / "locks"
    monkeypatch.setattr(autostart, "LOCK_DIRS", (str(tmp_path / "missing"),))
    assert autostart._lock_dir() == tmp_path / "elsewhere"  # fallback when none is usable


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_is_running(pid):
            return True
        time.sleep(0.1)
    return False


def _ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1:
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(") ", 1)[1].split()[1])
        chain.append(pid)
    return chain


def _shm_of(pid: int) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"lmcache_mp_{pid}_*"))


# -- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("arg", ["--host", "--port=7000", "--http-host"])
def test_reserved_server_args_are_refused(arg: str) -> None:
    with pytest.raises(ValueError, match="must not contain"):
        check_server_args(["--l1-size-gb", "1", arg])
    with pytest.raises(ValueError, match="must not contain"):
        parse_extra_config({"lmcache.mp.autostart.server_args": f"--chunk-size 256 {arg}"})


def test_only_local_urls_can_be_autostarted() -> None:
    assert local_host_port("tcp://127.0.0.1:6000") == ("127.0.0.1", 6000)
    assert local_host_port("tcp://localhost:5555") == ("localhost", 5555)
    for url in ("tcp://10.0.0.2:5555", "ipc:///tmp/x", "tcp://localhost"):
        with pytest.raises(ValueError, match="this machine only"):
            local_host_port(url)
    with pytest.raises(ValueError, match="this machine only"):
        parse_extra_config({"lmcache.mp.autostart": "true", "lmcache.mp.host": "tcp://10.1.1.1"})


def test_autostart_settings_are_parsed() -> None:
    config = parse_extra_config(
        {
            "lmcache.mp.autostart": "true",
            "lmcache.mp.autostart.server_args": ["--l1-size-gb", "2"],
            "lmcache.mp.autostart.wait_timeout": "30",
        }
    )
    assert config.autostart
    assert config.autostart_server_args == ("--l1-size-gb", "2")
    assert config.autostart_wait_timeout == 30.0
    assert not parse_extra_config({}).autostart
    with pytest.raises(ValueError, match="wait_timeout must be positive"):
        parse_extra_config({"lmcache.mp.autostart.wait_timeout": "0"})


# -- real servers -----------------------------------------------------------------------------


def test_starts_reuses_and_stops_a_real_server() -> None:
    url = f"tcp://127.0.0.1:{_unused_port()}"
    server = ensure_local_server(url, SMALL_SERVER, wait_timeout=60)
    assert server is not None
    try:
        assert server_answers(url)
        assert os.getpgid(server.pid) == server.pid  # its own process group
        assert os.getpid() not in _ancestors(server.pid)  # out of our process tree
        assert _shm_of(server.pid)  # the server's L1 segment
        # The next connector (another TP rank, the scheduler) reuses it.
        assert ensure_local_server(url, SMALL_SERVER, wait_timeout=60) is None
    finally:
        server.stop()
    assert not server.running and not process_is_running(server.pid)
    assert _shm_of(server.pid) == []  # SIGTERM let it unlink its shared memory
    assert not server_answers(url, timeout=0.5)
    server.stop()  # idempotent


def test_a_server_that_exits_reports_its_output(monkeypatch: pytest.MonkeyPatch) -> None:
    # A server module that cannot start fails at once (a real server's refusal of its
    # arguments takes seconds of imports first, and goes through the same path).
    monkeypatch.setattr(autostart, "SERVER_MODULE", "lmcache.no_such_server_module")
    url = f"tcp://127.0.0.1:{_unused_port()}"
    with pytest.raises(RuntimeError, match="exited") as info:
        ensure_local_server(url, SMALL_SERVER, wait_timeout=60)
    assert "No module named lmcache.no_such_server_module" in str(info.value)


def test_a_server_that_does_not_come_up_in_time_is_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[autostart.AutostartedServer] = []
    spawn = autostart._spawn

    def recording_spawn(*args: object) -> autostart.AutostartedServer:
        server = spawn(*args)  # type: ignore[arg-type]
        started.append(server)
        return server

    monkeypatch.setattr(autostart, "_spawn", recording_spawn)
    url = f"tcp://127.0.0.1:{_unused_port()}"
    with pytest.raises(RuntimeError, match=r"did not answer within 0\.1 s"):
        ensure_local_server(url, SMALL_SERVER, wait_timeout=0.1)
    assert len(started) == 1 and _wait_gone(started[0].pid, timeout=5)


def test_the_server_dies_with_a_killed_owner(tmp_path: Path) -> None:
    """SIGKILL gives atexit no chance (as vLLM's shutdown, which SIGKILLs its engine's
    process tree): the server notices its owner is gone and stops cleanly."""
    port = _unused_port()
    script = textwrap.dedent(
        f"""
        import sys, time
        from lmcache.integration.vllm.autostart import ensure_local_server
        server = ensure_local_server("tcp://127.0.0.1:{port}", {SMALL_SERVER!r}, 60)
        print(server.pid, flush=True)
        time.sleep(120)
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, env=os.environ.copy()
    )
    try:
        assert owner.stdout is not None
        server_pid = int(owner.stdout.readline())
        assert process_is_running(server_pid)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert _wait_gone(server_pid, timeout=30)
    assert _shm_of(server_pid) == []
