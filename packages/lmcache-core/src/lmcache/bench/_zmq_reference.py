"""The raw ZeroMQ bulk-transfer reference of ``lmcache bench server``'s inline path.

The same bytes in the same shape (one frame per chunk, one multipart message per request)
between a DEALER here and a ROUTER in another process over loopback TCP, zero-copy on both
sides and nothing else: no msgpack, no L1, no KV gather.  The inline path's throughput over
this is how close it comes to what the socket alone allows on this machine.

``python -m lmcache.bench._zmq_reference PORT CHUNK_BYTES CHUNKS`` runs the peer.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import zmq

_STORE = b"store"
_RETRIEVE = b"retrieve"
_STOP = b"stop"


@dataclass
class ZmqReference:
    """Raw ZeroMQ GB/s each way: bytes of the timed requests over their wall time."""

    store_gbps: float
    retrieve_gbps: float


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(chunk_bytes: int, chunks: int, iters: int) -> ZmqReference:
    """Time ``iters`` requests each way (after one untimed warm-up) against a peer process."""
    port = _free_port()
    peer = subprocess.Popen(
        [sys.executable, "-m", __name__, str(port), str(chunk_bytes), str(chunks)],
        stdout=subprocess.DEVNULL,
    )
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60_000)
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        payload = [memoryview(bytearray(chunk_bytes)) for _ in range(chunks)]
        store = _mean(iters, lambda: _round_trip(sock, [_STORE, *payload]))
        retrieve = _mean(iters, lambda: _round_trip(sock, [_RETRIEVE]))
        sock.send(_STOP)
    finally:
        sock.close()
        ctx.term()
        try:
            peer.wait(10)
        except subprocess.TimeoutExpired:
            peer.kill()
    nbytes = chunk_bytes * chunks
    return ZmqReference(nbytes / store / 1e9, nbytes / retrieve / 1e9)


def _round_trip(sock: zmq.Socket[Any], frames: list[Any]) -> None:
    sock.send_multipart(frames, copy=False)
    sock.recv_multipart(copy=False)


def _mean(iters: int, request: Any) -> float:
    """Seconds per request, timed like the server bench: wall clock over all of them."""
    request()  # warm-up: connection and first-touch of the buffers
    count = max(1, iters)
    start = time.perf_counter()
    for _ in range(count):
        request()
    return (time.perf_counter() - start) / count


def serve_peer(port: int, chunk_bytes: int, chunks: int) -> None:
    """The peer: takes stores (acks them) and answers retrieves with ``chunks`` frames."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 120_000)
    sock.bind(f"tcp://127.0.0.1:{port}")
    reply = [memoryview(bytearray(chunk_bytes)) for _ in range(chunks)]
    try:
        while True:
            frames = sock.recv_multipart(copy=False)
            identity, kind = frames[0].bytes, frames[1].bytes
            if kind == _STOP:
                return
            if kind == _RETRIEVE:
                sock.send_multipart([identity, *reply], copy=False)
            else:
                sock.send_multipart([identity, b"ok"])
    except zmq.Again:
        return
    finally:
        sock.close()
        ctx.term()


if __name__ == "__main__":
    serve_peer(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
