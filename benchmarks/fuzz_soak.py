#!/usr/bin/env python
"""Long wire-fuzz soak of ``lmcache server``: messages/s, missing replies, crashes, leaks.

Starts its own server on 127.0.0.1 (a free port), sends structure-aware fuzz messages
generated from ``protocol.RPC_SPECS`` (the generator of ``tests/v1/multiprocess/
wire_fuzz.py``, shared with the CI fuzz test) and checks that every message gets exactly
one reply.  A server that dies is counted as a crash, its log tail is printed, and a fresh
one is started so the soak goes on.  At the end the server must still store and retrieve
bit-exact.  Exit status 1 if anything failed.

    python benchmarks/fuzz_soak.py                       # 1,000,000 messages
    python benchmarks/fuzz_soak.py --messages 200000 --seed 42 --json soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "v1" / "multiprocess"))

from mp_server_helpers import make_kv, unlink_kv  # noqa: E402
from wire_fuzz import (  # noqa: E402
    FuzzResult,
    FuzzSession,
    MessageFactory,
    rss_bytes,
    semantic_seeds,
    shm_bytes,
    shm_segments,
    wrapper_exts,
)

from lmcache.v1.multiprocess.worker.client import MPClient, ServerUnavailableError  # noqa: E402

CHUNK_SIZE = 16
MAX_MESSAGE_MB = 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    def __init__(self, log_dir: Path, index: int) -> None:
        self.port = _free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"server-{index}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        cmd = [
            sys.executable, "-m", "lmcache.cli.main", "server", "--host", "127.0.0.1",
            "--port", str(self.port), "--supported-transfer-mode", "auto",
            "--chunk-size", str(CHUNK_SIZE), "--l1-size-gb", "0.0625",
            "--max-message-mb", str(MAX_MESSAGE_MB), "--max-workers", "2",
            "--worker-reap-timeout-seconds", "2", "--pending-transfer-timeout-seconds", "1",
            "--http-port", "0", "--prometheus-port", "0",
        ]  # fmt: skip
        env = dict(os.environ, LMCACHE_LOG_LEVEL="WARNING")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_ready()
        except BaseException:  # interrupted or failed start-up: leave no server behind
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited during start-up:\n{self.log_tail()}")
            try:
                MPClient(self.url, timeout=2, connect_timeout=0.5).close()
                return
            except ServerUnavailableError:
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text().splitlines()[-lines:])

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


def _bit_exact(url: str) -> bool:
    import torch

    from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

    kv, out = make_kv(seed=8), make_kv(seed=None)
    writer = KVCacheWorker(kv, model_name="after-soak", server_url=url, mode="engine_driven")
    reader = KVCacheWorker(out, model_name="after-soak", server_url=url, mode="engine_driven")
    try:
        tokens = list(range(2 * CHUNK_SIZE))
        if not (
            writer.store(tokens, list(range(8))) and reader.retrieve(tokens, list(range(8, 16)))
        ):
            return False
        return all(torch.equal(a[:, :8], b[:, 8:16]) for a, b in zip(kv, out))
    finally:
        writer.close()
        reader.close()


def _add(total: FuzzResult, part: FuzzResult) -> None:
    total.sent += part.sent
    total.replied += part.replied
    total.missing += part.missing
    total.unexpected += part.unexpected
    total.bad_replies += part.bad_replies
    total.slowest_reply_s = max(total.slowest_reply_s, part.slowest_reply_s)
    total.codes.update(part.codes)


def soak(args: argparse.Namespace) -> dict[str, Any]:
    seed = args.seed if args.seed is not None else secrets.randbits(63)
    print(f"fuzz soak: {args.messages} messages, seed {seed} (replay: --seed {seed})", flush=True)
    rng = random.Random(seed)
    kv = make_kv(shm=True, seed=3)
    wrappers = wrapper_exts(kv)
    factory = MessageFactory(
        rng, MAX_MESSAGE_MB * 1024**2, semantic_seeds(wrappers, CHUNK_SIZE), wrappers
    )
    uid = iter(range(1 << 62))
    messages = (factory.message(next(uid)) for _ in iter(int, 1))
    log_dir = Path(tempfile.mkdtemp(prefix="lmcache-fuzz-soak-"))
    crashes, servers_started = 0, 1
    server: Server | None = None
    session: FuzzSession | None = None
    total = FuzzResult()
    rss_start = shm_start = None
    try:
        server = Server(log_dir, 0)
        session = FuzzSession(server.url, reply_timeout_s=args.reply_timeout)
        start = time.monotonic()
        last_report = start
        while total.sent < args.messages:
            part = session.run(messages, min(args.step, args.messages - total.sent))
            _add(total, part)
            if not server.alive():
                crashes += 1
                print(f"CRASH #{crashes} (exit {server.proc.returncode}) after {total.sent} "
                      f"messages:\n{server.log_tail()}", flush=True)  # fmt: skip
                session.close()
                server.stop()
                server = None
                server = Server(log_dir, servers_started)
                servers_started += 1
                session = FuzzSession(server.url, reply_timeout_s=args.reply_timeout)
                rss_start = shm_start = None
                continue
            if rss_start is None and total.sent >= min(args.warmup, args.messages):
                rss_start, shm_start = rss_bytes(server.proc.pid), shm_segments(server.proc.pid)
            now = time.monotonic()
            if now - last_report >= args.progress_s or total.sent >= args.messages:
                last_report = now
                rate = total.sent / (now - start)
                print(f"  {total.sent:>9} sent  {rate:8.0f} msg/s  missing {total.missing}  "
                      f"unexpected {total.unexpected}  crashes {crashes}  "
                      f"rss {rss_bytes(server.proc.pid) / 2**20:.1f} MiB", flush=True)  # fmt: skip
        elapsed = time.monotonic() - start
        pid = server.proc.pid
        rss_end, shm_end = rss_bytes(pid), shm_segments(pid)
        alive = server.alive()
        bit_exact = alive and _bit_exact(server.url)
    finally:
        if session is not None:
            session.close()
        if server is not None:
            server.stop()
        unlink_kv(kv)
    new_shm = sorted(shm_end - (shm_start or set()))
    return {
        "seed": seed,
        "messages": total.sent,
        "elapsed_s": round(elapsed, 2),
        "messages_per_s": round(total.sent / elapsed, 1),
        "replied": total.replied,
        "missing_replies": total.missing,
        "unexpected_replies": total.unexpected,
        "bad_replies": total.bad_replies,
        "crashes": crashes,
        "slowest_window_s": round(total.slowest_reply_s, 3),
        "codes": dict(total.codes.most_common()),
        "strategies": dict(factory.strategy_counts.most_common()),
        "operations_fuzzed": len(factory.op_counts),
        "rss_after_warmup_mib": round((rss_start or 0) / 2**20, 1),
        "rss_end_mib": round(rss_end / 2**20, 1),
        "server_shm_segments_new": new_shm,
        "server_shm_new_bytes": shm_bytes(set(new_shm)),
        "server_alive": alive,
        "bit_exact_after": bit_exact,
        "server_logs": str(log_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: fresh)")
    parser.add_argument("--step", type=int, default=2000, help="messages between checks")
    parser.add_argument("--warmup", type=int, default=20000, help="messages before RSS baseline")
    parser.add_argument("--reply-timeout", type=float, default=15.0, help="seconds per reply")
    parser.add_argument("--progress-s", type=float, default=10.0, help="progress interval")
    parser.add_argument("--rss-growth-mib", type=float, default=64.0, help="allowed RSS growth")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    if args.messages <= 0:
        parser.error("--messages must be positive")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json: folder {args.json.parent} does not exist")
    # SIGTERM unwinds like Ctrl-C, so the server is stopped and the fuzz KV cache unlinked.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    report = soak(args)
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    growth = report["rss_end_mib"] - report["rss_after_warmup_mib"]
    failed = (
        report["crashes"]
        or report["missing_replies"]
        or report["unexpected_replies"]
        or report["bad_replies"]
        or report["codes"].get("internal", 0)
        or report["server_shm_new_bytes"] > 64 * 1024**2
        or growth > args.rss_growth_mib
        or not report["bit_exact_after"]
    )
    print(f"fuzz soak {'FAILED' if failed else 'passed'}: {report['messages']} messages, "
          f"{report['messages_per_s']:.0f} msg/s, crashes {report['crashes']}, missing "
          f"{report['missing_replies']}, RSS {report['rss_after_warmup_mib']} -> "
          f"{report['rss_end_mib']} MiB")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
