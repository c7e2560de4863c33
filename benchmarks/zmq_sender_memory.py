#!/usr/bin/env python
"""Peak memory of ``lmcache server`` while N peers send large requests at once.

Starts a server on 127.0.0.1 (a free port) for each case, lets ``N`` DEALER peers each
send ``--frames`` requests of one ``--frame-mb`` frame back to back (the senders of
``tests/v1/multiprocess/large_senders.py``, ``raw`` mode: the issue's reproduction), and
reports the server's peak RSS (VmHWM, reset when the senders start) above its RSS then,
with the replies each request got (``missing``: no reply, e.g. a frame over the transport
cap drops the connection).

    python benchmarks/zmq_sender_memory.py                          # N = 2 and 6, 500 MB
    python benchmarks/zmq_sender_memory.py --frame-mb 160 --server-arg=--max-message-mb=512
    # real inline stores (slower handlers, so requests stay in flight), 64 MiB chunks:
    python benchmarks/zmq_sender_memory.py --mode store --frame-mb 67.108864 --frames 4 \
        --server-arg=--l1-size-gb=0.5 --server-arg=--max-gpu-workers=1 \
        --server-arg=--max-inflight-mb=65
    # another tree's server (e.g. before a change), same senders:
    python benchmarks/zmq_sender_memory.py --server-pythonpath /tmp/base/packages/lmcache-core/src
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "v1" / "multiprocess"))

from large_senders import run_large_senders  # noqa: E402
from mp_server_helpers import free_port  # noqa: E402

from lmcache.v1.multiprocess.worker.client import MPClient, ServerUnavailableError  # noqa: E402

MB = 1000**2
MiB = 1024**2
CHUNK_SIZE = 16


def start_server(
    args: list[str], pythonpath: str | None, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(os.environ, LMCACHE_LOG_LEVEL="WARNING")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [
        sys.executable, "-m", "lmcache.cli.main", "server", "--host", "127.0.0.1",
        "--port", str(port), "--chunk-size", str(CHUNK_SIZE), "--l1-size-gb", "0.0625",
        "--http-port", "0", "--prometheus-port", "0", *args,
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"tcp://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited:\n{log.read_text()}")
        try:
            MPClient(url, timeout=2, connect_timeout=0.5).close()
            return proc, url
        except ServerUnavailableError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not come up")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--senders", type=int, nargs="+", default=[2, 6])
    parser.add_argument("--frames", type=int, default=3, help="requests per sender")
    parser.add_argument("--frame-mb", type=float, default=500.0, help="frame size (MB, 10^6)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra server flag")
    parser.add_argument("--server-pythonpath", default=None)
    parser.add_argument(
        "--mode", choices=["raw", "store"], default="raw", help="see large_senders.py"
    )
    parser.add_argument("--label", default="server")
    parser.add_argument("--reply-timeout", type=float, default=20.0)
    parser.add_argument("--json", default=None, help="append the results to this file")
    opts = parser.parse_args()
    frame_bytes = int(opts.frame_mb * MB)
    rows = []
    for senders in opts.senders:
        log = Path(tempfile.mkdtemp()) / "server.log"
        proc, url = start_server(opts.server_arg, opts.server_pythonpath, log)
        try:
            result = run_large_senders(
                url, proc.pid, senders, opts.frames, frame_bytes, CHUNK_SIZE,
                mode=opts.mode, reply_timeout_s=opts.reply_timeout,
            )  # fmt: skip
            alive = proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(30)
        row = {
            "label": opts.label,
            "mode": opts.mode,
            "senders": senders,
            "frames_per_sender": opts.frames,
            "frame_mb": opts.frame_mb,
            "server_args": opts.server_arg,
            "idle_rss_mib": round(result.baseline_rss / MiB),
            "peak_rss_mib": round(result.peak_rss / MiB),
            "peak_growth_mib": round(result.peak_growth / MiB),
            "replies": dict(result.codes),
            "missing": result.missing,
            "server_alive": alive,
            "elapsed_s": round(result.elapsed_s, 1),
        }
        rows.append(row)
        print(json.dumps(row))
    print(f"\n| {opts.label} | " + " | ".join(f"N={r['senders']}" for r in rows) + " |")
    print(
        "| peak RSS above idle (MiB) | "
        + " | ".join(
            f"+{r['peak_growth_mib']} (replies {r['replies']}, missing {r['missing']})"
            for r in rows
        )
        + " |"
    )
    if opts.json:
        with open(opts.json, "a") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
