"""Concurrent senders of large requests, and the server's peak memory while they run.

Shared by ``test_inflight_budget.py`` (CI) and ``benchmarks/zmq_sender_memory.py``.
Each sender is its own peer of the server and sends one data frame of ``frame_bytes`` per
request, in one of two ways:

* ``raw``: requests sent back to back from a DEALER, ``commit_store_frames`` for an
  instance id no worker registered: the server reads each whole (the transport's limits
  apply) and answers ``unknown_worker`` as soon as a handler runs it (the issue's
  reproduction: handlers that hold nothing for long).
* ``store``: real inline stores through ``MPClient``: each sender registers an
  engine-driven worker whose chunk is ``frame_bytes``, then, in rounds that all senders
  start together, prepares a chunk and commits it with ``commit_store_frames``; the
  handler copies the frame into L1 (prefaulted, so it adds no RSS).  A ``busy`` reply
  arrives as the client's ``ServerBusyError``.

All senders share one buffer, sent zero-copy, so the sending process holds it once.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
import time
import uuid
from pathlib import Path

import zmq

from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.wire.custom_types import (
    IPCCacheServerKey,
    RegisterEngineDrivenContextPayload,
)
from lmcache.v1.multiprocess.worker.client import (
    MPClient,
    ServerBusyError,
    ServerError,
    ServerUnavailableError,
)

MODEL = "large-senders"
UNREGISTERED_INSTANCE = 424242
# Store mode: chunks of 2 x chunk_size x this x 2 bytes per layer (bf16).
STORE_HIDDEN_DIM = 32768
STORE_RETRIES = 50


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(f"{field} not in /proc/{pid}/status")


def rss_bytes(pid: int) -> int:
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int) -> int:
    """The process's resident high-water mark (VmHWM)."""
    return _status_kib(pid, "VmHWM") * 1024


def reset_peak_rss(pid: int) -> None:
    """Set the high-water mark back to the current RSS (Linux >= 4.0; the caller's own
    processes only)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@dataclasses.dataclass
class LoadResult:
    senders: int
    frames_per_sender: int
    frame_bytes: int
    codes: collections.Counter[str]  # "ok" or the error code of each reply
    missing: int  # requests without a reply within REPLY_TIMEOUT_S
    baseline_rss: int
    peak_rss: int
    elapsed_s: float

    @property
    def peak_growth(self) -> int:
        return self.peak_rss - self.baseline_rss


def _key(tag: str, chunk_size: int) -> IPCCacheServerKey:
    # Distinct tokens per tag: a chunk never stored before, so prepare_store allocates it.
    seed = int.from_bytes(hashlib.blake2b(tag.encode(), digest_size=6).digest(), "little")
    return IPCCacheServerKey.from_token_ids(MODEL, 1, 0, range(seed, seed + chunk_size))


def _classify(reply: list[bytes]) -> str:
    if not protocol.is_error_operation(protocol.decode(reply[1])):
        return "ok"
    return str(protocol.decode(reply[2], protocol.ErrorReply).code)


@dataclasses.dataclass
class _Shared:
    url: str
    payload: memoryview
    frames_per_sender: int
    chunk_size: int
    reply_timeout_s: float
    start: threading.Barrier
    raw: bool
    run: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    codes: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    missing: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def record(self, got: collections.Counter[str]) -> None:
        """One sender's replies; the requests that got no final one are missing (in store
        mode a ``busy`` is not final: the commit is sent again)."""
        final = sum(n for code, n in got.items() if code != "busy" or self.raw)
        with self.lock:
            self.codes.update(got)
            self.missing += self.frames_per_sender - final


def _raw_sender(shared: _Shared, ctx: zmq.Context[zmq.Socket[bytes]], index: int) -> None:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    got: collections.Counter[str] = collections.Counter()
    try:
        sock.connect(shared.url)
        shared.start.wait()
        for n in range(shared.frames_per_sender):
            key = _key(f"{shared.run}-raw-{index}-{n}", shared.chunk_size)
            head = protocol.encode_request(
                n + 1, "commit_store_frames", [key, UNREGISTERED_INSTANCE, [0]]
            )
            sock.send_multipart([*head, shared.payload], copy=False)
        deadline = time.monotonic() + shared.reply_timeout_s
        while sum(got.values()) < shared.frames_per_sender:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 or not sock.poll(left_ms):
                break
            got[_classify(sock.recv_multipart())] += 1
    finally:
        sock.close(0)
        shared.record(got)


def _store_layout(frame_bytes: int, chunk_size: int) -> tuple[int, int]:
    """(layers, hidden dim) of a bf16 layout whose chunk is exactly ``frame_bytes``."""
    per_layer = 2 * chunk_size * STORE_HIDDEN_DIM * 2
    if frame_bytes % per_layer:
        raise ValueError(f"store mode needs frames of a multiple of {per_layer} bytes")
    return frame_bytes // per_layer, STORE_HIDDEN_DIM


def _store_sender(shared: _Shared, index: int) -> None:
    layers, hidden = _store_layout(len(shared.payload), shared.chunk_size)
    instance_id = 7_000_000 + index
    got: collections.Counter[str] = collections.Counter()
    client = MPClient(shared.url, timeout=shared.reply_timeout_s)
    try:
        client.register_kv_cache_engine_driven_context(
            RegisterEngineDrivenContextPayload(
                instance_id=instance_id,
                model_name=MODEL,
                world_size=1,
                block_size=shared.chunk_size,
                num_layers=layers,
                hidden_dim_size=hidden,
                dtype_str="bfloat16",
                use_mla=False,
            )
        )
        client.call("set_engine_driven_sub_path", instance_id, "inline")
        for n in range(shared.frames_per_sender):
            key = _key(f"{shared.run}-store-{index}-{n}", shared.chunk_size)
            shared.start.wait()  # every round starts together
            try:
                todo = client.prepare_store(key, instance_id).context["chunk_indices"]
                got.update(_commit_with_retries(client, key, instance_id, todo, shared.payload))
            except ServerError as exc:
                got[exc.code] += 1
            except ServerUnavailableError:
                break
    finally:
        client.close()
        shared.record(got)


def _commit_with_retries(
    client: MPClient, key: IPCCacheServerKey, instance_id: int, todo: list[int], frame: memoryview
) -> collections.Counter[str]:
    """Commit, sending it again after each ``busy`` (what a retryable error invites: the
    prepared chunk is still waiting); one ``busy`` per refusal, then the final outcome."""
    got: collections.Counter[str] = collections.Counter()
    for attempt in range(STORE_RETRIES):
        try:
            client.call_bulk("commit_store_frames", key, instance_id, todo, frames=[frame])
        except ServerBusyError as exc:
            assert exc.retryable and exc.code == "busy", exc
            got["busy"] += 1
            time.sleep(0.02 * (attempt + 1))
            continue
        except ServerError as exc:
            got[exc.code] += 1
            return got
        got["ok"] += 1
        return got
    got["gave_up"] += 1
    return got


def run_large_senders(
    url: str,
    server_pid: int,
    senders: int,
    frames_per_sender: int,
    frame_bytes: int,
    chunk_size: int,
    mode: str = "raw",
    reply_timeout_s: float = 60.0,
) -> LoadResult:
    """``senders`` peers send ``frames_per_sender`` requests each (see the module
    docstring for ``mode``); the server's peak RSS over the run (its high-water mark,
    reset first)."""
    rounds = 1 if mode == "raw" else frames_per_sender
    shared = _Shared(
        url,
        memoryview(bytearray(frame_bytes)),
        frames_per_sender,
        chunk_size,
        reply_timeout_s,
        threading.Barrier(senders + 1),
        raw=mode == "raw",
    )
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    if mode == "raw":
        threads = [
            threading.Thread(target=_raw_sender, args=(shared, ctx, i), daemon=True)
            for i in range(senders)
        ]
    elif mode == "store":
        threads = [
            threading.Thread(target=_store_sender, args=(shared, i), daemon=True)
            for i in range(senders)
        ]
    else:
        raise ValueError(f"unknown mode {mode!r}")
    for thread in threads:
        thread.start()
    try:
        shared.start.wait(reply_timeout_s)
        reset_peak_rss(server_pid)
        baseline = rss_bytes(server_pid)
        began = time.monotonic()
        for _ in range(rounds - 1):
            shared.start.wait(reply_timeout_s * 2)
    except threading.BrokenBarrierError:
        raise RuntimeError("a sender failed before its round (see its exception)") from None
    finally:
        for thread in threads:
            thread.join(reply_timeout_s * 2)
    elapsed = time.monotonic() - began
    peak = peak_rss_bytes(server_pid)
    ctx.term()
    return LoadResult(
        senders, frames_per_sender, frame_bytes, shared.codes, shared.missing, baseline, peak,
        elapsed,
    )  # fmt: skip
