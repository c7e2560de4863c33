"""Admin operations are not anonymous: ``clear`` (and every ``RpcSpec.admin`` operation) is
refused on the wire unless the server runs with ``--enable-admin-ops``, and then needs the
admin token when one is configured.  Listeners on non-loopback addresses are warned about.

Servers bind 0.0.0.0 in one test only; every connection goes to 127.0.0.1."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from mp_server_helpers import BASE_ARGS, ServerProcess, Stored, free_port

from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.multiprocess.wire import protocol
from lmcache.v1.multiprocess.wire.security import (
    ADMIN_TOKEN_ENV,
    AdminPolicy,
    AdminTokenError,
    TokenCheck,
    is_loopback_host,
    resolve_admin_token,
    warn_if_exposed,
)
from lmcache.v1.multiprocess.worker.client import MPClient, ServerError

TOKEN = "s3cret-admin-token-" + "0123456789abcdef"
WRONG = "not-the-admin-token-0123456789abcdef"

# The operations that only read server-wide facts (protocol.Access.READ), reviewed: none
# changes state.  Every other operation but the admin ones acts for its caller only.
READ_ONLY = frozenset(
    {
        "get_chunk_size",
        "noop",
        "get_experimental",
        "get_stats",
        # Reads only the announced chunk hashes of a model (no data, no state change).
        "subscribe_kv_events",
    }
)


# -- helpers ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_token_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers and clients here start without a developer's LMCACHE_ADMIN_TOKEN."""
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "token"
    path.write_text(TOKEN + "\n")  # as `kubectl create secret --from-file` often leaves it
    path.chmod(0o400)
    return path


def _engine_server(factory: Callable[..., ServerProcess], *args: str) -> ServerProcess:
    return factory("--supported-transfer-mode", "engine_driven", *args)


@pytest.fixture(scope="module")
def plain_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """Started without any admin flag."""
    return _engine_server(server_factory)


@pytest.fixture(scope="module")
def token_server(server_factory: Callable[..., ServerProcess], token_file: Path) -> ServerProcess:
    return _engine_server(
        server_factory, "--enable-admin-ops", "--admin-token-file", str(token_file)
    )


def _raw_request(url: str, operation: Any, *payloads: Any) -> list[Any]:
    """One request from a fresh, never-registered socket (no handshake); decoded reply."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(url)
        sock.send_multipart(
            [
                protocol.encode(1),
                protocol.encode(operation),
                *(protocol.encode(p) for p in payloads),
            ]
        )
        assert sock.poll(10_000), "no reply within 10 s"
        return [msgspec.msgpack.decode(f) for f in sock.recv_multipart()]
    finally:
        sock.close()
        ctx.term()


def _error_code(reply: list[Any]) -> str:
    assert protocol.is_error_operation(reply[1]), f"not an error reply: {reply}"
    return str(reply[2]["code"])


# -- the RPC table ---------------------------------------------------------------------------


def test_every_operation_declares_what_it_may_touch() -> None:
    by_access = {
        access: {name for name, spec in protocol.RPC_SPECS.items() if spec.access is access}
        for access in protocol.Access
    }
    assert by_access[protocol.Access.ADMIN] == {"clear"} == protocol.ADMIN_OPERATIONS
    assert by_access[protocol.Access.READ] == READ_ONLY
    # No default: a new operation cannot be added without deciding.
    with pytest.raises(TypeError, match="access"):
        protocol.RpcSpec("new_op", (), None)  # type: ignore[call-arg]
    for name in protocol.ADMIN_OPERATIONS:
        spec = protocol.RPC_SPECS[name]
        # The token is an optional trailing payload: upstream clients never send it.
        assert spec.payload_types[-1] == protocol.ADMIN_TOKEN_TYPE
        assert spec.min_payloads < len(spec.payload_types)


def test_error_codes_reach_upstream_clients_in_the_op_frame() -> None:
    for code in (protocol.ErrorCode.FORBIDDEN, protocol.ErrorCode.UNAUTHORIZED):
        frames = protocol.encode_error(b"\x01", code, "why", "clear")
        op = msgspec.msgpack.decode(frames[1])
        assert op == f"__error__ {code.value}: why"
        assert protocol.decode(frames[2], protocol.ErrorReply).code == code.value


# -- token resolution ------------------------------------------------------------------------


def test_token_file_wins_and_is_stripped(token_file: Path) -> None:
    assert resolve_admin_token(None, str(token_file), {ADMIN_TOKEN_ENV: WRONG}) == TOKEN
    assert resolve_admin_token(TOKEN, None, {ADMIN_TOKEN_ENV: WRONG}) == TOKEN
    assert resolve_admin_token(None, None, {ADMIN_TOKEN_ENV: TOKEN}) == TOKEN
    assert resolve_admin_token(None, None, {}) is None


@pytest.mark.parametrize(
    ("token", "token_file", "message"),
    [
        (TOKEN, "/some/file", "not both"),
        (None, "/nonexistent/lmcache/token", "cannot read"),
        ("short", None, "at least 16"),
        ("has a space in the token!", None, "printable ASCII"),
        ("x" * 20 + "\u00e9", None, "printable ASCII"),
    ],
)
def test_bad_token_configuration_is_a_clear_error(
    token: str | None, token_file: str | None, message: str
) -> None:
    with pytest.raises(AdminTokenError, match=message) as info:
        resolve_admin_token(token, token_file, {})
    if token:
        assert token not in str(info.value)


def test_token_checks_and_never_shows_in_reprs() -> None:
    policy = AdminPolicy(wire_enabled=True, token=TOKEN)
    assert policy.check_token(TOKEN) is TokenCheck.OK
    assert policy.check_token(None) is TokenCheck.MISSING
    assert policy.check_token("") is TokenCheck.MISSING
    assert policy.check_token(WRONG) is TokenCheck.WRONG
    assert policy.check_token(TOKEN[:-1]) is TokenCheck.WRONG
    assert AdminPolicy(wire_enabled=True).check_token(None) is TokenCheck.OK
    assert TOKEN not in repr(policy)
    assert TOKEN not in repr(MPServerConfig(admin_token=TOKEN))


def test_refused_admin_requests_are_logged_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from lmcache.v1.multiprocess.server.rate_limited_logs import RefusalLog

    limited = RefusalLog(interval_s=3600)
    with caplog.at_level(
        logging.WARNING, logger="lmcache.v1.multiprocess.server.rate_limited_logs"
    ):
        for _ in range(5):
            limited.note("clear", "admin operations are off")
        assert len(caplog.records) == 1
        every = RefusalLog(interval_s=0)
        every.note("clear", "wrong admin token")
        every.note("clear", "wrong admin token")
    assert len(caplog.records) == 3
    assert all("refused admin request clear" in r.getMessage() for r in caplog.records)


# -- the wire --------------------------------------------------------------------------------


def test_anonymous_clear_is_refused_and_data_survives(plain_server: ServerProcess) -> None:
    server = plain_server
    with Stored(server) as data:
        # Legacy id 20 as upstream sends it, with and without force, and by name; the token
        # slot changes nothing while admin operations are off.
        for operation, payloads in [
            (20, ()),
            (20, (True,)),
            ("clear", (True, TOKEN)),
        ]:
            reply = _raw_request(server.url, operation, *payloads)
            assert _error_code(reply) == "forbidden"
            assert "--enable-admin-ops" in reply[2]["message"]
        with server.client() as client, pytest.raises(ServerError) as info:
            client.clear(force=True)
        assert info.value.code == "forbidden"
        assert data.retrieves_bit_exact()
        assert "refused admin request clear" in server.log()


def test_every_admin_operation_is_refused_without_the_flag(plain_server: ServerProcess) -> None:
    server = plain_server
    for name in sorted(protocol.ADMIN_OPERATIONS):
        assert protocol.RPC_SPECS[name].min_payloads == 0, f"give {name} valid payloads here"
        assert _error_code(_raw_request(server.url, name)) == "forbidden", name


def test_flag_without_token_allows_clear(server_factory: Callable[..., ServerProcess]) -> None:
    server = _engine_server(server_factory, "--enable-admin-ops")
    with Stored(server) as data:
        reply = _raw_request(server.url, 20)  # upstream's form: no payload at all
        assert not protocol.is_error_operation(reply[1]), reply
        assert data.is_gone()
        assert not data.retrieves_bit_exact()


def test_token_is_required_when_configured(token_server: ServerProcess) -> None:
    server = token_server
    with Stored(server) as data:
        with server.client() as client:
            with pytest.raises(ServerError) as missing:
                client.clear()
            assert missing.value.code == "unauthorized"
            assert "none was presented" in missing.value.message
            with pytest.raises(ServerError) as wrong:
                client.clear(admin_token=WRONG)
            assert wrong.value.code == "unauthorized" and "wrong" in str(wrong.value)
        assert _error_code(_raw_request(server.url, 20, False, TOKEN.upper())) == "unauthorized"
        assert _error_code(_raw_request(server.url, 20, False, "")) == "unauthorized"
        assert data.retrieves_bit_exact()

        with MPClient(server.url, timeout=10, admin_token=TOKEN) as admin:
            admin.clear()
        assert data.is_gone()
        assert not data.retrieves_bit_exact()

        log = server.log()
        assert "refused admin request clear (missing admin token)" in log
        assert TOKEN not in log and WRONG not in log


def test_client_presents_the_token_from_the_environment(
    token_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = token_server
    with Stored(server) as data:
        monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
        with server.client() as client:
            client.clear()
        assert data.is_gone()


def test_unreadable_token_file_stops_the_server_before_it_allocates(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    server = ServerProcess(
        [*BASE_ARGS, "--enable-admin-ops", "--admin-token-file", str(missing)],
        tmp_path / "server.log",
    )
    try:
        assert server.proc.wait(60) != 0
        assert f"--admin-token-file {missing}: cannot read it" in server.log()
        assert not list(Path("/dev/shm").glob(f"lmcache_mp_{server.proc.pid}_*"))
    finally:
        server.stop()


# -- exposed listeners -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("*", False),
        ("", False),
        ("10.1.2.3", False),
        ("192.168.0.7", False),
        ("no-such-host.invalid", False),
    ],
)
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_warning_names_the_listener_and_the_doc(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lmcache.v1.multiprocess.wire.security"):
        assert warn_if_exposed("the ZMQ RPC port", "0.0.0.0", 5555, "store chunks")
        assert not warn_if_exposed("the ZMQ RPC port", "127.0.0.1", 5555, "store chunks")
    (record,) = caplog.records
    text = record.getMessage()
    assert "the ZMQ RPC port listens on 0.0.0.0:5555" in text
    assert "docs/operations.md#threat-model" in text


def test_non_loopback_listeners_are_warned_about(
    server_factory: Callable[..., ServerProcess],
) -> None:
    http_port, prom_port = free_port(), free_port()
    exposed = server_factory(
        "--host", "0.0.0.0", "--http-host", "0.0.0.0",
        "--http-port", str(http_port), "--prometheus-port", str(prom_port),
        "--enable-admin-ops",
    )  # fmt: skip
    log = exposed.log()
    assert f"the ZMQ RPC port listens on 0.0.0.0:{exposed.port}" in log
    assert "wipe the whole cache (--enable-admin-ops without an admin token)" in log
    assert f"the HTTP frontend listens on 0.0.0.0:{http_port}" in log
    assert f"the Prometheus endpoint listens on 0.0.0.0:{prom_port}" in log
    assert log.count("docs/operations.md#threat-model") == 3

    quiet = server_factory(
        "--http-port", str(free_port()), "--prometheus-port", str(free_port())
    )  # fmt: skip
    assert "threat-model" not in quiet.log()
