"""A server with CURVE keys: only authorized client keys get any reply; the rest get none."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch
from auth_helpers import CHUNK, GEO, KeyRing, keyed, make_keyring, noop_request, raw_replies
from mp_server_helpers import make_kv, unlink_kv

from lmcache.v1.multiprocess.wire.curve import CurveKeyError
from lmcache.v1.multiprocess.worker.client import MPClient, ServerUnavailableError
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker

# How long a refused client waits for a reply that must never come.
SILENCE_S = 1.5
MODES = [("engine_driven", "inline"), ("engine_driven", "shm"), ("lmcache_driven", None)]


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> KeyRing:
    return make_keyring(tmp_path_factory.mktemp("keys"))


def test_client_without_keys_gets_no_reply_at_all(
    ring: KeyRing, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), keyed(ring) as (server, engine):
        assert raw_replies(server.endpoint, noop_request(), None, SILENCE_S) == []
        started = time.monotonic()
        with pytest.raises(ServerUnavailableError, match="CURVE"):
            MPClient(server.endpoint, timeout=1.0, connect_timeout=1.0)
        assert time.monotonic() - started < 10  # bounded: it never hangs
        assert engine.metrics is not None
        text = engine.metrics.exposition().decode()
    assert 'lmcache_mp_auth_refused_total{mechanism="handshake"}' in text
    failed = [r for r in caplog.records if "failed the CURVE handshake" in r.getMessage()]
    assert len(failed) == 1  # rate-limited, though the client retries


def test_wrong_key_is_refused_logged_and_counted(
    ring: KeyRing, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), keyed(ring) as (server, engine):
        outsider = ring.outsider()
        assert raw_replies(server.endpoint, noop_request(), outsider, SILENCE_S) == []
        with pytest.raises(ServerUnavailableError, match="authorized-keys"):
            MPClient(server.endpoint, timeout=1.0, connect_timeout=1.0, curve=outsider)
        assert engine.metrics is not None
        text = engine.metrics.exposition().decode()
    refused = [r for r in caplog.records if "refused a CURVE connection" in r.getMessage()]
    assert refused and outsider.public.decode() in refused[0].getMessage()
    # A client retries the handshake about once a second: the log stays rate-limited.
    assert len(refused) == 1
    assert 'lmcache_mp_auth_refused_total{mechanism="CURVE"}' in text


def test_a_server_key_other_than_the_servers_gets_no_reply(ring: KeyRing, tmp_path: Path) -> None:
    from lmcache.v1.multiprocess.wire.curve import CurveClientKeys, write_key_pair

    fake_public, _ = write_key_pair(tmp_path, "fake-server")
    keys = CurveClientKeys.from_files(ring.clients["alice"], fake_public)
    with keyed(ring) as (server, _engine):
        assert raw_replies(server.endpoint, noop_request(), keys, SILENCE_S) == []


@pytest.mark.parametrize(("mode", "sub_path"), MODES)
def test_authorized_key_stores_and_retrieves(
    ring: KeyRing, mode: str, sub_path: str | None
) -> None:
    shm = mode == "lmcache_driven"
    kv, out = make_kv(shm=shm, seed=5, **GEO), make_kv(shm=shm, seed=None, **GEO)
    with keyed(ring) as (server, _engine):
        args = {
            "model_name": "curve",
            "server_url": server.endpoint,
            "mode": mode,
            "sub_path": sub_path,
            "curve_secret_key_file": str(ring.clients["alice"]),
            "curve_server_key_file": str(ring.server_public),
        }
        writer, reader = KVCacheWorker(kv, **args), KVCacheWorker(out, **args)
        try:
            tokens = list(range(2 * CHUNK))
            assert writer.store(tokens, list(range(8)))
            assert reader.lookup(tokens) == len(tokens)
            assert reader.retrieve(tokens, list(range(8, 16)))
            for a, b in zip(kv, out):
                assert torch.equal(a[:, :8], b[:, 8:16])
        finally:
            writer.close()
            reader.close()
            if shm:
                unlink_kv(kv)
                unlink_kv(out)


def test_worker_needs_both_key_files(ring: KeyRing) -> None:
    with pytest.raises(CurveKeyError, match="both"):
        KVCacheWorker(
            make_kv(**GEO),
            model_name="m",
            curve_secret_key_file=str(ring.clients["alice"]),
        )


def test_one_server_flag_without_the_other_is_refused(ring: KeyRing) -> None:
    from lmcache.v1.multiprocess.server import build_cache_server
    from lmcache.v1.multiprocess.server_config import MPServerConfig

    with pytest.raises(CurveKeyError, match="together"):
        build_cache_server(
            MPServerConfig(
                chunk_size=CHUNK,
                l1_size_gb=1 / 1024,
                shm_name="",
                curve_secret_key_file=str(ring.server_secret),
            )
        )


def test_exposed_bind_warns_only_without_keys(
    ring: KeyRing, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        with keyed(ring, host="0.0.0.0"):
            pass
        keyed_lines = [r for r in caplog.records if "not a loopback" in r.getMessage()]
        caplog.clear()
        from auth_helpers import serve

        with serve(host="0.0.0.0"):
            pass
        open_lines = [r for r in caplog.records if "not a loopback" in r.getMessage()]
    assert not [r for r in keyed_lines if "RPC" in r.getMessage()]
    assert any("clear text" in r.getMessage() for r in open_lines)


class _Tap:
    """A TCP relay between one client and the server that keeps every byte it relays."""

    def __init__(self, target_port: int) -> None:
        import socket
        import threading

        self.seen = bytearray()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._target = target_port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: object, dst: object) -> None:
        while True:
            try:
                data = src.recv(65536)  # type: ignore[attr-defined]
            except OSError:
                return
            if not data:
                dst.close()  # type: ignore[attr-defined]
                return
            with self._lock:
                self.seen += data
            dst.sendall(data)  # type: ignore[attr-defined]

    def close(self) -> None:
        self._listener.close()


@pytest.mark.parametrize("with_keys", [False, True])
def test_kv_bytes_cross_the_wire_encrypted_only_with_keys(ring: KeyRing, with_keys: bool) -> None:
    """The inline path through a relay: the stored KV bytes appear on the wire in clear
    text without keys (the control), never with them."""
    from auth_helpers import serve

    kv = make_kv(seed=11, **GEO)
    needle = bytes(kv[0][:, 0].contiguous().view(torch.uint8).flatten()[:256].tolist())
    context = keyed(ring) if with_keys else serve()
    with context as (server, _engine):
        tap = _Tap(int(server.endpoint.rsplit(":", 1)[1]))
        keys = (
            {
                "curve_secret_key_file": str(ring.clients["alice"]),
                "curve_server_key_file": str(ring.server_public),
            }
            if with_keys
            else {}
        )
        worker = KVCacheWorker(
            kv,
            model_name="tap",
            server_url=f"tcp://127.0.0.1:{tap.port}",
            mode="engine_driven",
            sub_path="inline",
            **keys,
        )
        try:
            assert worker.store(list(range(2 * CHUNK)), list(range(8)))
        finally:
            worker.close()
            tap.close()
    assert (needle in tap.seen) is not with_keys
