"""HTTPS on the HTTP frontend and the Prometheus listener; the bearer token of the read
routes (--http-tls-certfile/--http-tls-keyfile, --http-read-token-file)."""

from __future__ import annotations

import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from lmcache.v1.multiprocess.server import MPCacheServer
from lmcache.v1.multiprocess.server.http_frontend import HTTPFrontend, PrometheusEndpoint

READ_TOKEN = "read-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(keyfile), "-out", str(certfile)],
        check=True, capture_output=True,
    )  # fmt: skip
    return certfile, keyfile


@pytest.fixture
def frontend(
    make_engine: Callable[..., MPCacheServer], cert: tuple[Path, Path], tmp_path: Path
) -> Iterator[Callable[..., HTTPFrontend]]:
    started: list[HTTPFrontend] = []

    def start(tls: bool = True, read_token: bool = True) -> HTTPFrontend:
        token_file = tmp_path / "read-token"
        token_file.write_text(READ_TOKEN + "\n")
        overrides: dict[str, object] = {"admin_token": ADMIN_TOKEN, "disable_metrics": False}
        if tls:
            overrides |= {"http_tls_certfile": str(cert[0]), "http_tls_keyfile": str(cert[1])}
        if read_token:
            overrides["http_read_token_file"] = str(token_file)
        server = HTTPFrontend(make_engine(**overrides), "127.0.0.1", 0)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _get(url: str, verify: ssl.SSLContext | bool, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + 20
    while True:
        try:
            return httpx.get(url, verify=verify, headers=headers, timeout=5)
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _trusting(cert: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert[0]))


def test_https_frontend_serves_tls_only(
    frontend: Callable[..., HTTPFrontend], cert: tuple[Path, Path]
) -> None:
    server = frontend(read_token=False)
    assert server.url.startswith("https://")
    assert _get(f"{server.url}/status", _trusting(cert)).status_code == 200
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.port}/status", timeout=5)


def test_read_routes_need_the_read_or_admin_token(
    frontend: Callable[..., HTTPFrontend],
) -> None:
    server = frontend(tls=False)
    base = server.url
    for route in ("/status", "/config", "/metrics", "/threads"):
        refused = _get(base + route, False)
        assert refused.status_code == 401, route
        assert refused.json()["error"] == "unauthorized"
        assert _get(base + route, False, "wrong-token-0123456789").status_code == 401
        assert _get(base + route, False, READ_TOKEN).status_code == 200, route
        assert _get(base + route, False, ADMIN_TOKEN).status_code == 200, route
    for route in ("/", "/healthcheck"):
        assert _get(base + route, False).status_code == 200, route


def test_without_a_read_token_the_read_routes_stay_open(
    frontend: Callable[..., HTTPFrontend],
) -> None:
    server = frontend(tls=False, read_token=False)
    assert _get(server.url + "/status", False).status_code == 200


def test_prometheus_listener_over_tls(
    make_engine: Callable[..., MPCacheServer], cert: tuple[Path, Path]
) -> None:
    engine = make_engine(disable_metrics=False)
    assert engine.metrics is not None
    endpoint = PrometheusEndpoint(
        engine.metrics.registry, "127.0.0.1", 0, str(cert[0]), str(cert[1])
    )
    try:
        reply = _get(f"https://127.0.0.1:{endpoint.port}/metrics", _trusting(cert))
        assert reply.status_code == 200 and "lmcache_mp" in reply.text
    finally:
        endpoint.stop()


def test_bad_tls_and_token_flags_are_refused_at_start_up(
    make_engine: Callable[..., MPCacheServer], cert: tuple[Path, Path], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="together"):
        make_engine(http_tls_certfile=str(cert[0]))
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate")
    with pytest.raises(ValueError, match="cannot load"):
        make_engine(http_tls_certfile=str(bogus), http_tls_keyfile=str(cert[1]))
    short = tmp_path / "short"
    short.write_text("abc")
    with pytest.raises(ValueError, match="http-read-token-file"):
        make_engine(http_read_token_file=str(short))
