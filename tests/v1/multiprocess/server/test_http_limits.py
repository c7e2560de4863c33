"""The HTTP frontend's connection limits over real sockets: slowloris clients are closed
after the header timeout, slow bodies after the body timeout, the connection cap holds,
and a normal request succeeds during and after."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from mp_server_helpers import ServerProcess, free_port

from lmcache.v1.multiprocess.server import MPCacheServer
from lmcache.v1.multiprocess.server.http_frontend import HTTPFrontend
from lmcache.v1.multiprocess.server.http_limits import HTTPLimits

SLOWLORIS = 50
CAP = 20
TIMEOUT_S = 1.0
# Generous: the machine may be loaded; the point is "closed", not "closed fast".
CLOSE_DEADLINE_S = 15.0
TRICKLE_EVERY_S = 0.2


@pytest.fixture
def start_frontend(
    make_engine: Callable[..., MPCacheServer],
) -> Iterator[Callable[..., HTTPFrontend]]:
    started: list[HTTPFrontend] = []

    def start(**limits: float) -> HTTPFrontend:
        engine = make_engine(enable_http_cache_clear=True)
        settings = {"header_timeout_s": TIMEOUT_S, "body_timeout_s": TIMEOUT_S} | limits
        frontend = HTTPFrontend(
            engine,
            "127.0.0.1",
            0,
            allow_cache_clear=True,
            limits=HTTPLimits(**settings),  # type: ignore[arg-type]
        )
        frontend.start()
        started.append(frontend)
        _wait_until_serving(frontend)
        return frontend

    yield start
    for frontend in started:
        frontend.stop()


def _wait_until_serving(frontend: HTTPFrontend) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{frontend.url}/healthcheck", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError("the HTTP frontend did not come up")


def _healthy(frontend: HTTPFrontend) -> None:
    reply = httpx.get(f"{frontend.url}/healthcheck", timeout=10)
    assert reply.status_code == 200 and reply.json() == {"status": "healthy"}


class Loris:
    """A client that sends a partial request head and then one header line at a time."""

    def __init__(self, frontend: HTTPFrontend, head: bytes) -> None:
        self._open(frontend.host, frontend.port, head)

    def _open(self, host: str, port: int, head: bytes) -> None:
        self.sock = socket.create_connection((host, port), timeout=5)
        self.sock.setblocking(False)
        self.opened_at = time.monotonic()
        self.closed_at: float | None = None
        self.received = b""
        self.sock.sendall(head)

    def poll(self, trickle: bytes | None) -> None:
        """Read what the server sent; note when it closed; send ``trickle`` if still open."""
        if self.closed_at is not None:
            return
        try:
            while chunk := self.sock.recv(65536):
                self.received += chunk
            self._closed()  # orderly EOF
            return
        except BlockingIOError:
            pass
        except OSError:  # reset
            self._closed()
            return
        if trickle:
            try:
                self.sock.send(trickle)
            except OSError:
                self._closed()

    def _closed(self) -> None:
        self.closed_at = time.monotonic()
        self.sock.close()

    def reply(self) -> tuple[int, dict[str, str]] | None:
        """The status and JSON body the server answered with before closing, if any."""
        if not self.received:
            return None
        head, _, body = self.received.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)


class _RawLoris(Loris):
    def __init__(self, host: str, port: int) -> None:
        self._open(host, port, b"GET / HTTP/1.1\r\nHost: lmcache\r\n")


def _trickle_until_closed(lorises: list[Loris], line: bytes | None) -> None:
    deadline = time.monotonic() + CLOSE_DEADLINE_S
    while time.monotonic() < deadline and any(x.closed_at is None for x in lorises):
        for loris in lorises:
            loris.poll(line)
        time.sleep(TRICKLE_EVERY_S)
    for loris in lorises:
        if loris.closed_at is None:
            loris.sock.close()


def test_slowloris_connections_are_closed_and_normal_requests_succeed(
    start_frontend: Callable[..., HTTPFrontend],
) -> None:
    frontend = start_frontend(max_connections=CAP)
    lorises = [
        Loris(frontend, b"GET /healthcheck HTTP/1.1\r\nHost: lmcache\r\n") for _ in range(SLOWLORIS)
    ]
    for loris in lorises:
        loris.poll(b"X-Slow: 1\r\n")
    # During: the cap is full of trickling clients, and a normal request still gets in.
    _healthy(frontend)
    time.sleep(0.3)
    assert frontend.open_connections <= CAP + 1
    _trickle_until_closed(lorises, b"X-Slow: 1\r\n")

    still_open = [x for x in lorises if x.closed_at is None]
    assert not still_open, f"{len(still_open)} of {SLOWLORIS} trickling clients stay open"
    # Trickling does not extend the timeout.
    lifetimes = [x.closed_at - x.opened_at for x in lorises if x.closed_at is not None]
    assert max(lifetimes) < CLOSE_DEADLINE_S - 5, lifetimes
    # Each is told why (503 when the cap made room for a newer one, 408 on its timeout),
    # unless its next trickle crossed the close and the reset swallowed the reply.
    replies = [r for r in (x.reply() for x in lorises) if r is not None]
    codes = [(status, body["error"]) for status, body in replies]
    assert set(codes) <= {(503, "too_many_connections"), (408, "request_timeout")}, codes
    assert (408, "request_timeout") in codes
    stats = frontend.limit_stats
    assert stats.header_timeouts >= 1 and stats.evicted >= SLOWLORIS - CAP
    assert stats.header_timeouts + stats.evicted >= SLOWLORIS
    # After: served as before, and nothing is left open.
    _healthy(frontend)
    assert frontend.open_connections <= 1


def test_silent_connections_are_closed_after_the_header_timeout(
    start_frontend: Callable[..., HTTPFrontend],
) -> None:
    frontend = start_frontend()
    silent = [Loris(frontend, b"") for _ in range(5)]
    _trickle_until_closed(silent, None)
    assert all(x.closed_at is not None for x in silent)
    assert all(x.reply() is None for x in silent)  # nothing was asked, nothing is answered
    assert frontend.limit_stats.header_timeouts == 5
    _healthy(frontend)


def _slow_body_head(length: int = 100) -> bytes:
    return (
        b"POST /cache/clear HTTP/1.1\r\nHost: lmcache\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(length).encode() + b"\r\n\r\n" + b'{"force": '
    )


def test_a_body_that_never_finishes_is_closed_after_the_body_timeout(
    start_frontend: Callable[..., HTTPFrontend], caplog: pytest.LogCaptureFixture
) -> None:
    frontend = start_frontend()
    slow = [Loris(frontend, _slow_body_head()) for _ in range(3)]
    _trickle_until_closed(slow, b" ")
    assert all(x.closed_at is not None for x in slow)
    assert frontend.limit_stats.body_timeouts == 3
    _healthy(frontend)
    # The handler saw its client go away: an answer, not a traceback.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_past_the_cap_with_every_connection_busy_a_new_one_gets_503(
    start_frontend: Callable[..., HTTPFrontend],
) -> None:
    frontend = start_frontend(max_connections=2, body_timeout_s=60.0)
    busy = [Loris(frontend, _slow_body_head()) for _ in range(2)]
    try:
        deadline = time.monotonic() + 10
        refused = None
        while time.monotonic() < deadline:
            refused = httpx.get(f"{frontend.url}/healthcheck", timeout=10)
            if refused.status_code == 503:
                break
            time.sleep(0.1)  # the busy requests' heads may not be parsed yet
        assert refused is not None and refused.status_code == 503, refused
        assert refused.json()["error"] == "too_many_connections"
        assert frontend.limit_stats.refused >= 1
    finally:
        for loris in busy:
            loris.sock.close()
    deadline = time.monotonic() + 10
    while frontend.open_connections and time.monotonic() < deadline:
        time.sleep(0.05)
    _healthy(frontend)


def test_keep_alive_clients_are_served_across_the_header_timeout(
    start_frontend: Callable[..., HTTPFrontend],
) -> None:
    frontend = start_frontend(max_connections=2)
    with httpx.Client(base_url=frontend.url, timeout=10) as client:
        for _ in range(3):
            assert client.get("/healthcheck").status_code == 200
        time.sleep(TIMEOUT_S * 2)  # the idle keep-alive connection is closed meanwhile
        assert client.get("/healthcheck").status_code == 200


def test_the_flags_reach_a_real_servers_frontend(
    server_factory: Callable[..., ServerProcess],
) -> None:
    http_port = free_port()
    server = server_factory(
        "--http-port", str(http_port), "--http-header-timeout-s", "1",
        "--http-body-timeout-s", "1", "--http-max-connections", "4",
    )  # fmt: skip
    url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/", timeout=5)
            break
        except httpx.TransportError:
            time.sleep(0.1)
    config = httpx.get(f"{url}/config", timeout=5).json()["mp"]
    assert config["http_header_timeout_s"] == 1.0 and config["http_max_connections"] == 4
    lorises: list[Loris] = [_RawLoris("127.0.0.1", http_port) for _ in range(8)]
    _trickle_until_closed(lorises, b"X-Slow: 1\r\n")
    assert all(x.closed_at is not None for x in lorises)
    assert httpx.get(f"{url}/healthcheck", timeout=10).status_code == 200
    assert "(--http-header-timeout-s)" in server.log()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--http-header-timeout-s", "0"),
        ("--http-body-timeout-s", "-1"),
        ("--http-max-connections", "0"),
    ],
)
def test_bad_limit_flags_are_refused(flag: str, value: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "lmcache.cli.main", "server", flag, value],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode != 0, run.stderr
    assert run.stderr.startswith(f"lmcache server: error: argument {flag}"), run.stderr
