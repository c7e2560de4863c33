"""In-process servers with CURVE keys (and tenants) for the authentication tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import zmq
from mp_server_helpers import in_process_server

from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.wire.curve import CurveClientKeys, write_key_pair

CHUNK = 16
GEO = {"num_layers": 2, "num_heads": 2, "head_size": 16, "num_blocks": 16, "block_size": 4}


@dataclasses.dataclass
class KeyRing:
    """A server pair, authorized client pairs (``clients/``) and one outsider pair."""

    root: Path
    server_secret: Path
    server_public: Path
    authorized_dir: Path
    clients: dict[str, Path]  # name -> secret file
    outsider_secret: Path

    def client(self, name: str) -> CurveClientKeys:
        return CurveClientKeys.from_files(self.clients[name], self.server_public)

    def outsider(self) -> CurveClientKeys:
        return CurveClientKeys.from_files(self.outsider_secret, self.server_public)


def make_keyring(root: Path, names: tuple[str, ...] = ("alice", "bob")) -> KeyRing:
    server_public, server_secret = write_key_pair(root / "server", "server")
    authorized = root / "authorized"
    secrets = root / "secrets"
    clients = {}
    for name in names:
        public, secret = write_key_pair(secrets, name)
        authorized.mkdir(exist_ok=True)
        (authorized / public.name).write_bytes(public.read_bytes())
        clients[name] = secret
    _public, outsider = write_key_pair(secrets, "outsider")
    return KeyRing(root, server_secret, server_public, authorized, clients, outsider)


def serve(**overrides: Any) -> Any:
    """An in-process server with ``overrides`` of its config (chunks of ``CHUNK`` tokens,
    no prefetch)."""
    fields = {"chunk_size": CHUNK, "l2_prefetch_max_in_flight": 0}
    return in_process_server(**(fields | overrides))


def keyed(ring: KeyRing, **overrides: Any) -> Any:
    return serve(
        curve_secret_key_file=str(ring.server_secret),
        authorized_keys=str(ring.authorized_dir),
        **overrides,
    )


def raw_replies(
    url: str, frames: list[bytes], keys: CurveClientKeys | None, wait_s: float
) -> list[list[bytes]]:
    """Send one request on a fresh DEALER; every reply within ``wait_s`` seconds."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if keys is not None:
        keys.apply(sock)
    try:
        sock.connect(url)
        sock.send_multipart(frames)
        replies = []
        wait_ms = int(wait_s * 1000)
        while sock.poll(wait_ms):
            replies.append(sock.recv_multipart())
            wait_ms = 200
        return replies
    finally:
        sock.close(0)
        ctx.term()


def noop_request(uid: int = 1) -> list[bytes]:
    return [protocol.encode(uid), protocol.encode("noop")]
