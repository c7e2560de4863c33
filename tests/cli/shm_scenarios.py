"""``lmcache server`` shared-memory scenarios, run inside a private ``/dev/shm``.

Run by tests/cli/test_server_shm.py under ``private_shm`` (and by hand, for the numbers in
a report); prints one JSON document on stdout.

* ``concurrent N``: N servers start together.  With ``--gate`` (the default) each server
  runs the real L1 size check and then waits until every server has passed it before any
  allocates: the window in which two servers starting together both see room for one.
  Each server then either runs (answers a ping) or exits by itself; the running ones are
  stopped with SIGTERM, and what is left in ``/dev/shm`` is listed.
* ``crash-loop K``: K times, start a server and SIGKILL it once it is listening, beside
  one live neighbour server that runs throughout; ``/dev/shm`` usage after each kill.

Usage: ``python shm_scenarios.py concurrent 8 --l1-size-gb 0.05`` or
``python shm_scenarios.py crash-loop 20 --l1-size-gb 0.02``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHM_DIR = Path("/dev/shm")
READY_LINE = "listening on"
START_TIMEOUT_S = 120.0
RECLAIMED = "reclaimed orphaned shared-memory segment"

# A server whose L1 size check waits at a gate (a file) once it has passed.
_GATED_SERVER = """
import os, sys, time
import lmcache.cli.main as cli
import lmcache.v1.multiprocess.server.run  # noqa: F401  (imports done before the gate)
import lmcache.v1.multiprocess.server.startup as startup

gate, argv = sys.argv[1], sys.argv[2:]
real_check = startup.check_l1_fits

def check_then_wait(size_gb, in_shm):
    real_check(size_gb, in_shm)
    open(os.path.join(gate, f"passed-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(gate, "go")) and time.monotonic() < deadline:
        time.sleep(0.002)

startup.check_l1_fits = check_then_wait
sys.exit(cli.main(["server", *argv]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shm_used_bytes() -> int:
    st = os.statvfs(SHM_DIR)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def shm_entries() -> dict[str, int]:
    """Name -> bytes held, of everything in /dev/shm."""
    found = {}
    for path in SHM_DIR.iterdir():
        try:
            found[path.name] = path.stat().st_blocks * 512
        except FileNotFoundError:
            continue
    return found


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMCACHE_")}
    env["LMCACHE_LOG_LEVEL"] = "WARNING"
    return env


# Every server started, so a scenario that fails half-way still stops them all.
_STARTED: list[Server] = []


class Server:
    """One ``lmcache server`` subprocess, its output in files under ``workdir``."""

    def __init__(
        self, workdir: Path, index: int, flags: list[str], gate: Path | None = None
    ) -> None:
        self.port = free_port()
        self.out_path = workdir / f"server{index}.out"
        self.err_path = workdir / f"server{index}.err"
        argv = ["--port", str(self.port), "--http-port", "0", "--prometheus-port", "0", *flags]
        if gate is None:
            command = [sys.executable, "-m", "lmcache.cli.main", "server", *argv]
        else:
            command = [sys.executable, "-c", _GATED_SERVER, str(gate), *argv]
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(command, stdout=out, stderr=err, env=_env())
        _STARTED.append(self)

    def announced(self) -> bool:
        return READY_LINE in self.out_path.read_text()

    def wait_settled(self, deadline: float) -> None:
        """Until it announced itself or exited."""
        while self.proc.poll() is None and not self.announced():
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on port {self.port} neither ran nor exited")
            time.sleep(0.05)

    def answers_ping(self) -> bool:
        from lmcache.v1.multiprocess.worker.client import MPClient, ServerUnavailableError

        try:
            MPClient(f"tcp://127.0.0.1:{self.port}", timeout=10, connect_timeout=10).close()
            return True
        except ServerUnavailableError:
            return False

    def stop(self, sig: int) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return -999  # did not stop: reported as such

    def stderr_lines(self) -> list[str]:
        return [line for line in self.err_path.read_text().splitlines() if line.strip()]


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return str(-rc)


def _outcome(server: Server, exited_by_itself: bool, alive: bool, stop_rc: int | None) -> str:
    """``ran``, ``refused`` (rc 1, one error line, no traceback) or what else happened."""
    rc = server.proc.returncode
    if exited_by_itself:
        if rc is not None and rc < 0:
            return f"died by {_signal_name(rc)}"
        lines = server.stderr_lines()
        one_line = bool(lines) and lines[-1].startswith("lmcache server: error: ")
        if rc == 1 and one_line and "Traceback" not in "\n".join(lines):
            return "refused"
        return f"exited rc={rc}"
    if alive and stop_rc == 0:
        return "ran"
    return f"ran, ping answered={alive}, rc after SIGTERM={stop_rc}"


def concurrent(count: int, l1_size_gb: float, gate: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="lmcache-shm-race-"))
    gate_dir = workdir / "gate" if gate else None
    if gate_dir is not None:
        gate_dir.mkdir()
    flags = ["--l1-size-gb", str(l1_size_gb)]
    servers = [Server(workdir, i, flags, gate_dir) for i in range(count)]
    deadline = time.monotonic() + START_TIMEOUT_S
    if gate_dir is not None:
        # Every server past the size check (or gone) before any of them allocates.
        while True:
            passed = {p.name for p in gate_dir.iterdir()}
            waiting = [s for s in servers if f"passed-{s.proc.pid}" not in passed]
            if all(s.proc.poll() is not None for s in waiting):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("servers never reached the gate")
            time.sleep(0.01)
        passed_check = len(passed)
        (gate_dir / "go").touch()
    else:
        passed_check = -1
    for server in servers:
        server.wait_settled(deadline)
    exited = [server.proc.poll() is not None for server in servers]
    alive = [not gone and server.answers_ping() for server, gone in zip(servers, exited)]
    during = shm_entries()
    stop_rcs = [
        None if gone else server.stop(signal.SIGTERM) for server, gone in zip(servers, exited)
    ]
    outcomes = [
        _outcome(server, gone, up, rc)
        for server, gone, up, rc in zip(servers, exited, alive, stop_rcs)
    ]
    return {
        "servers": count,
        "l1_size_gb": l1_size_gb,
        "gated": gate,
        "passed_size_check": passed_check,
        "outcomes": outcomes,
        "return_codes": [server.proc.returncode for server in servers],
        "refusals": [(s.stderr_lines() or [""])[-1] for s, g in zip(servers, exited) if g],
        "shm_while_running": during,
        "shm_left": shm_entries(),
    }


def crash_loop(kills: int, l1_size_gb: float) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="lmcache-shm-crash-"))
    flags = ["--l1-size-gb", str(l1_size_gb)]
    neighbour = Server(workdir, 0, flags)
    neighbour.wait_settled(time.monotonic() + START_TIMEOUT_S)
    neighbour_segments = sorted(n for n in shm_entries() if f"_{neighbour.proc.pid}_" in n)
    before = shm_used_bytes()
    used_after_kill = []
    kill_rcs = []
    started = [neighbour]
    for i in range(kills):
        server = Server(workdir, i + 1, flags)
        started.append(server)
        server.wait_settled(time.monotonic() + START_TIMEOUT_S)
        if server.proc.poll() is not None:
            raise RuntimeError(f"server {i} exited: {server.stderr_lines()[-5:]}")
        kill_rcs.append(server.stop(signal.SIGKILL))
        used_after_kill.append(shm_used_bytes())
    neighbour_alive = neighbour.proc.poll() is None and neighbour.answers_ping()
    neighbour_kept = all((SHM_DIR / name).exists() for name in neighbour_segments)
    left_before_neighbour_stops = shm_entries()
    neighbour_rc = neighbour.stop(signal.SIGTERM)
    # One more start and clean stop reclaims what the last kill left.
    final = Server(workdir, kills + 1, flags)
    started.append(final)
    final.wait_settled(time.monotonic() + START_TIMEOUT_S)
    final_rc = final.stop(signal.SIGTERM)
    reclaimed = [line for server in started for line in server.stderr_lines() if RECLAIMED in line]
    return {
        "kills": kills,
        "l1_size_gb": l1_size_gb,
        "kill_return_codes": sorted(set(kill_rcs)),
        "used_before": before,
        "used_after_each_kill": used_after_kill,
        "neighbour_segments": neighbour_segments,
        "neighbour_alive": neighbour_alive,
        "neighbour_segment_kept": neighbour_kept,
        "neighbour_stop_rc": neighbour_rc,
        "left_before_neighbour_stops": left_before_neighbour_stops,
        "final_stop_rc": final_rc,
        "reclaimed_lines": len(reclaimed),
        "reclaimed_example": reclaimed[:1],
        "used_at_end": shm_used_bytes(),
        "left_at_end": shm_entries(),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="scenario", required=True)
    race = sub.add_parser("concurrent")
    race.add_argument("servers", type=int)
    race.add_argument("--l1-size-gb", type=float, required=True)
    race.add_argument("--no-gate", action="store_true")
    loop = sub.add_parser("crash-loop")
    loop.add_argument("kills", type=int)
    loop.add_argument("--l1-size-gb", type=float, required=True)
    args = parser.parse_args()
    try:
        if args.scenario == "concurrent":
            result = concurrent(args.servers, args.l1_size_gb, gate=not args.no_gate)
        else:
            result = crash_loop(args.kills, args.l1_size_gb)
    finally:
        for server in _STARTED:
            if server.proc.poll() is None:
                server.stop(signal.SIGKILL)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
