"""CurveZMQ on the RPC port: key files, the server's ZAP handler, the client's socket options.

With ``--curve-secret-key-file`` and ``--authorized-keys DIR`` the server's ROUTER is a
CURVE server: every connection is encrypted and authenticated, and the ZAP handler here
admits only the client public keys found in ``DIR`` (``*.key`` files).  A client without
keys, or with a key that is not listed, never completes the handshake: it gets no reply
at all, and the refusal is logged (rate-limited) and counted.  The admitted key becomes
the ZAP ``User-Id`` of every message of that connection (``zmq.Frame.get("User-Id")``),
which is how the server knows which tenant is talking (:mod:`.tenants`).

Key files use ``zmq.auth``'s certificate format, so ``zmq.auth.create_certificates`` and
``lmcache keys new NAME`` make interchangeable files: ``NAME.key`` holds the public key,
``NAME.key_secret`` (mode 0600) the public and the secret key.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
from zmq.utils import z85

from lmcache.logging import RateLimitedLog

logger = logging.getLogger(__name__)

# libzmq's well-known ZAP endpoint (RFC 27); the handler binds it in the server's context.
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = "lmcache"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
_Z85_KEY_CHARS = 40
_ZAP_POLL_MS = 100
# A refused key is logged at most this often per key (a client retries every second).
_REFUSAL_LOG_INTERVAL_S = 60.0


class CurveKeyError(ValueError):
    """A key file or key directory is unusable (missing, unreadable, malformed)."""


# -- key files ------------------------------------------------------------------------------


def _z85_key(value: bytes, path: Path, which: str) -> bytes:
    if len(value) != _Z85_KEY_CHARS:
        raise CurveKeyError(
            f"{path}: the {which} key is {len(value)} characters; a CURVE key in Z85 is "
            f"{_Z85_KEY_CHARS} (make key files with `lmcache keys new NAME`)"
        )
    try:
        z85.decode(value)
    except (ValueError, KeyError, IndexError):
        raise CurveKeyError(f"{path}: the {which} key is not valid Z85") from None
    return value


def read_key_file(path: str | os.PathLike[str], need_secret: bool) -> tuple[bytes, bytes | None]:
    """``(public, secret)`` Z85 keys from a ``zmq.auth`` certificate file; the secret is
    None for a public-key file.  Raises :class:`CurveKeyError` with the path and the cause."""
    file = Path(path)
    public: bytes | None = None
    secret: bytes | None = None
    try:
        lines = file.read_bytes().splitlines()
    except OSError as exc:
        raise CurveKeyError(f"{file}: cannot read the key file ({exc.strerror or exc})") from None
    for raw in lines:
        line = raw.strip()
        if line.startswith(b"public-key"):
            public = line.split(b"=", 1)[-1].strip(b" \t'\"")
        elif line.startswith(b"secret-key"):
            secret = line.split(b"=", 1)[-1].strip(b" \t'\"")
    if public is None:
        raise CurveKeyError(f"{file}: no public-key line (not a zmq.auth certificate file)")
    if need_secret and secret is None:
        raise CurveKeyError(
            f"{file}: holds no secret key; give the {SECRET_SUFFIX} file of the pair"
        )
    public = _z85_key(public, file, "public")
    if secret is not None:
        secret = _z85_key(secret, file, "secret")
        if zmq.curve_public(secret) != public:
            raise CurveKeyError(f"{file}: the public key does not belong to the secret key")
    return public, secret


def _certificate(public: bytes, secret: bytes | None, name: str) -> str:
    kind = "Secret" if secret else "Public"
    lines = [
        f"#   ****  Generated {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC by "
        f"`lmcache keys new {name}`  ****",
        f"#   ZeroMQ CURVE {kind} Certificate",
        "#   Exchange securely, or use a secure mechanism to verify the contents"
        if not secret
        else "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.",
        "",
        "metadata",
        "curve",
        f'    public-key = "{public.decode()}"',
    ]
    if secret:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def _write_new(path: Path, text: str, mode: int) -> None:
    """Create ``path`` with ``mode`` from the start (never a moment readable by others);
    an existing file is an error, never overwritten."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise CurveKeyError(f"{path} exists; remove it or choose another name") from None
    except OSError as exc:
        raise CurveKeyError(f"{path}: cannot create it ({exc.strerror or exc})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(path, mode)  # the umask may have taken bits away; never added any


def write_key_pair(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """A fresh CURVE key pair: ``NAME.key`` (public, 0644) and ``NAME.key_secret``
    (0600) in ``directory``; returns both paths."""
    if not name or "/" in name or name.startswith(".") or name != name.strip():
        raise CurveKeyError(f"key name {name!r}: use a plain file name (no '/', no leading dot)")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    public_path, secret_path = folder / f"{name}{PUBLIC_SUFFIX}", folder / f"{name}{SECRET_SUFFIX}"
    for path in (public_path, secret_path):
        if path.exists():
            raise CurveKeyError(f"{path} exists; remove it or choose another name")
    _write_new(secret_path, _certificate(public, secret, name), 0o600)
    _write_new(public_path, _certificate(public, None, name), 0o644)
    return public_path, secret_path


def _warn_if_readable_by_others(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning(
            "the CURVE secret key file %s is readable by other users (mode %o); chmod 600 it",
            path,
            stat.S_IMODE(mode),
        )


def load_authorized_keys(directory: str | os.PathLike[str]) -> dict[bytes, str]:
    """Every client public key in ``directory`` (its ``*.key`` files) -> the file's stem."""
    folder = Path(directory)
    if not folder.is_dir():
        raise CurveKeyError(f"--authorized-keys {folder}: not a directory")
    keys: dict[bytes, str] = {}
    for path in sorted(folder.glob(f"*{PUBLIC_SUFFIX}")):
        public, _secret = read_key_file(path, need_secret=False)
        keys.setdefault(public, path.name[: -len(PUBLIC_SUFFIX)])
    if not keys:
        raise CurveKeyError(
            f"--authorized-keys {folder}: no *{PUBLIC_SUFFIX} files, so no client could "
            f"connect; copy each client's public key file there (`lmcache keys new NAME`)"
        )
    return keys


# -- the two ends ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CurveClientKeys:
    """A client's key pair and the server's public key (all Z85)."""

    public: bytes
    secret: bytes = dataclasses.field(repr=False)
    server_public: bytes

    @classmethod
    def from_files(
        cls, secret_key_file: str | os.PathLike[str], server_key_file: str | os.PathLike[str]
    ) -> CurveClientKeys:
        """The client's ``NAME.key_secret`` and the server's public ``.key`` file."""
        public, secret = read_key_file(secret_key_file, need_secret=True)
        assert secret is not None
        _warn_if_readable_by_others(Path(secret_key_file))
        server_public, _ = read_key_file(server_key_file, need_secret=False)
        return cls(public, secret, server_public)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE client of the server (before it connects)."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)


def client_keys_from_files(
    secret_key_file: str | None, server_key_file: str | None, where: str
) -> CurveClientKeys | None:
    """Both files, or neither (None: a plaintext client); ``where`` names the settings."""
    if not secret_key_file and not server_key_file:
        return None
    if not (secret_key_file and server_key_file):
        raise CurveKeyError(
            f"{where}: give both the client's secret key file and the server's public key "
            f"file, or neither"
        )
    return CurveClientKeys.from_files(secret_key_file, server_key_file)


@dataclasses.dataclass(frozen=True)
class CurveServerKeys:
    """The server's key pair and the client keys it admits (Z85 public key -> name)."""

    public: bytes
    secret: bytes = dataclasses.field(repr=False)
    authorized: dict[bytes, str]

    @classmethod
    def from_files(
        cls, secret_key_file: str | os.PathLike[str], authorized_keys_dir: str | os.PathLike[str]
    ) -> CurveServerKeys:
        public, secret = read_key_file(secret_key_file, need_secret=True)
        assert secret is not None
        _warn_if_readable_by_others(Path(secret_key_file))
        return cls(public, secret, load_authorized_keys(authorized_keys_dir))

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make ``sock`` a CURVE server that asks the ZAP handler (before it binds)."""
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())


def server_keys_from_files(
    secret_key_file: str | None, authorized_keys_dir: str | None
) -> CurveServerKeys | None:
    """Both flags, or neither (None: the wire is open and in clear text)."""
    if not secret_key_file and not authorized_keys_dir:
        return None
    if not (secret_key_file and authorized_keys_dir):
        raise CurveKeyError(
            "give --curve-secret-key-file and --authorized-keys together (a CURVE server "
            "without a list of clients would admit anyone who knows its public key)"
        )
    return CurveServerKeys.from_files(secret_key_file, authorized_keys_dir)


def peer_key(frame: zmq.Frame) -> str | None:
    """The Z85 public key ZAP admitted for the connection ``frame`` came on (None: no
    CURVE on this socket)."""
    try:
        value = frame.get("User-Id")
    except zmq.ZMQError:
        return None
    return str(value) if value else None


# -- ZAP ------------------------------------------------------------------------------------


class ZapHandler:
    """Answers libzmq's ZAP requests for one context: CURVE clients whose public key is
    authorized get 200 with the key as ``User-Id``; everything else gets 400.

    ``on_refusal`` is called (on the handler thread) with the refused key's name for each
    refusal, for the metrics; the log line is rate-limited per key.
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        authorized: dict[bytes, str],
        on_refusal: Callable[[str], None] | None = None,
    ) -> None:
        self._authorized = dict(authorized)
        self._on_refusal = on_refusal
        self._sock = context.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)
        self._stop = threading.Event()
        self._log = RateLimitedLog(logger, _REFUSAL_LOG_INTERVAL_S)
        self.refused = 0
        self.admitted = 0
        self._thread = threading.Thread(target=self._serve, name="lmc-zap", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._sock.poll(_ZAP_POLL_MS):
                    continue
                request = self._sock.recv_multipart()
                self._sock.send_multipart(self._answer(request))
        except zmq.ContextTerminated:
            pass
        except Exception:  # the handler must not die silently: every client would hang
            logger.exception("the ZAP handler failed; CURVE clients can no longer connect")
        finally:
            self._sock.close(linger=0)

    def _answer(self, request: list[bytes]) -> list[bytes]:
        # [version, request_id, domain, address, identity, mechanism, *credentials]
        if len(request) < 6:
            return [
                b"1.0",
                request[1] if len(request) > 1 else b"",
                b"500",
                b"bad request",
                b"",
                b"",
            ]
        version, request_id, _domain, address, _identity, mechanism, *credentials = request
        if mechanism == b"CURVE" and credentials and len(credentials[0]) == 32:
            key = z85.encode(credentials[0])
            if key in self._authorized:
                self.admitted += 1
                return [version, request_id, b"200", b"OK", key, b""]
            self._refuse(address.decode(errors="replace"), key.decode(), mechanism.decode())
        else:
            self._refuse(address.decode(errors="replace"), "", mechanism.decode(errors="replace"))
        return [version, request_id, b"400", b"not an authorized client key", b"", b""]

    def _refuse(self, address: str, key: str, mechanism: str) -> None:
        self.refused += 1
        self._log.log(
            logging.WARNING,
            key or mechanism,
            "refused a %s connection from %s: client key %s is not in --authorized-keys",
            mechanism,
            address or "?",
            key or "(none)",
        )
        if self._on_refusal is not None:
            try:
                self._on_refusal(mechanism)
            except Exception:
                logger.debug("counting a ZAP refusal failed", exc_info=True)

    def close(self) -> None:
        """Stop answering (call before the context is terminated)."""
        self._stop.set()
        self._thread.join(timeout=2.0)


class HandshakeMonitor:
    """Logs (rate-limited) and counts connections that fail the CURVE handshake before ZAP
    is asked: clients without keys, or with keys for another server.  ZAP's own refusals
    (a key that is not listed) are :class:`ZapHandler`'s.

    ``on_failure`` is called on the monitor's thread for each failed handshake.
    """

    _EVENTS = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL

    def __init__(self, sock: zmq.Socket[Any], on_failure: Callable[[], None] | None = None) -> None:
        self._monitor = sock.get_monitor_socket(self._EVENTS)
        self._on_failure = on_failure
        self._stop = threading.Event()
        self._log = RateLimitedLog(logger, _REFUSAL_LOG_INTERVAL_S)
        self.failed = 0
        self._thread = threading.Thread(target=self._serve, name="lmc-curve-mon", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        from zmq.utils.monitor import recv_monitor_message

        try:
            while not self._stop.is_set():
                if self._monitor.poll(_ZAP_POLL_MS):
                    recv_monitor_message(self._monitor)
                    self._note()
        except zmq.ZMQError:
            pass  # the context is going away
        finally:
            self._monitor.close(linger=0)

    def _note(self) -> None:
        self.failed += 1
        self._log.log(
            logging.WARNING,
            "handshake",
            "a connection failed the CURVE handshake (a client without keys, or with keys "
            "for another server); it gets no reply",
        )
        if self._on_failure is not None:
            try:
                self._on_failure()
            except Exception:
                logger.debug("counting a failed handshake failed", exc_info=True)

    def close(self) -> None:
        """Stop reading events (call before the context is terminated)."""
        self._stop.set()
        self._thread.join(timeout=2.0)
