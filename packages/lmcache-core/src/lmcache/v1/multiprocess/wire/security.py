"""Who may do what to the cache server: the admin policy and exposed listeners.

Operations that act on every worker's data or on server-wide state (``RpcSpec.admin``;
today ``clear``) are refused on the ZMQ wire unless the server runs with
``--enable-admin-ops``.  When an admin token is configured (``--admin-token-file``,
``LMCACHE_ADMIN_TOKEN`` or ``--admin-token``), an admin request must also carry it: on the
wire as the operation's optional trailing payload, over HTTP as ``Authorization: Bearer``.
Tokens are compared in constant time and never logged.

The token is a shared secret sent in clear text (there is no TLS): it keeps careless or
anonymous peers from wiping the cache, not an eavesdropper on the path.  See the threat
model in docs/operations.md.
"""

from __future__ import annotations

import dataclasses
import enum
import hmac
import ipaddress
import logging
import socket
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

ADMIN_TOKEN_ENV = "LMCACHE_ADMIN_TOKEN"
MIN_ADMIN_TOKEN_CHARS = 16
THREAT_MODEL_DOC = "docs/operations.md#threat-model"


class AdminTokenError(ValueError):
    """The configured admin token is unusable (unreadable file, too short, bad characters)."""


class TokenCheck(enum.Enum):
    OK = "ok"
    MISSING = "missing"
    WRONG = "wrong"


@dataclasses.dataclass(frozen=True)
class AdminPolicy:
    """Whether admin operations are served on the wire, and the token they need (if any)."""

    wire_enabled: bool = False
    token: str | None = dataclasses.field(default=None, repr=False)

    def check_token(self, presented: str | None) -> TokenCheck:
        """``OK`` when no token is configured or ``presented`` equals it."""
        if self.token is None:
            return TokenCheck.OK
        if not presented:
            return TokenCheck.MISSING
        if hmac.compare_digest(presented.encode(), self.token.encode()):
            return TokenCheck.OK
        return TokenCheck.WRONG


def validate_admin_token(token: str, source: str) -> str:
    """``token`` if it can be an admin token; it must fit an HTTP ``Authorization`` header."""
    if len(token) < MIN_ADMIN_TOKEN_CHARS:
        raise AdminTokenError(
            f"the admin token from {source} has {len(token)} characters; use at least "
            f"{MIN_ADMIN_TOKEN_CHARS} (e.g. `openssl rand -hex 32`)"
        )
    if not all("!" <= ch <= "~" for ch in token):
        raise AdminTokenError(
            f"the admin token from {source} holds whitespace, control or non-ASCII "
            f"characters; use printable ASCII only (e.g. `openssl rand -hex 32`)"
        )
    return token


def _read_token_file(path: str, flag: str = "--admin-token-file") -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise AdminTokenError(f"{flag} {path}: cannot read it ({reason})") from None
    # A Secret mounted from `kubectl create secret --from-file` often ends with a newline.
    return text.strip()


@dataclasses.dataclass(frozen=True)
class HTTPSecurity:
    """TLS for the HTTP listeners and the bearer token of the HTTP read routes."""

    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    read_token: str | None = dataclasses.field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.tls_certfile is not None

    def check_read_token(self, presented: str | None) -> TokenCheck:
        """``OK`` without a read token, or when ``presented`` is it."""
        return AdminPolicy(token=self.read_token).check_token(presented)


def http_security(
    tls_certfile: str | None, tls_keyfile: str | None, read_token_file: str | None
) -> HTTPSecurity:
    """The flags checked (certificate and key load, the token file reads); raises
    ``ValueError`` naming the flag, before anything binds."""
    if bool(tls_certfile) != bool(tls_keyfile):
        raise ValueError("give --http-tls-certfile and --http-tls-keyfile together")
    if tls_certfile and tls_keyfile:
        import ssl

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                tls_certfile, tls_keyfile
            )
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"--http-tls-certfile {tls_certfile} / --http-tls-keyfile {tls_keyfile}: "
                f"cannot load them ({exc})"
            ) from None
    token = None
    if read_token_file:
        token = validate_admin_token(
            _read_token_file(read_token_file, "--http-read-token-file"),
            f"--http-read-token-file {read_token_file}",
        )
    return HTTPSecurity(tls_certfile or None, tls_keyfile or None, token)


def resolve_admin_token(
    token: str | None, token_file: str | None, environ: Mapping[str, str]
) -> str | None:
    """The admin token: ``--admin-token-file``, else ``--admin-token``, else the env var."""
    if token and token_file:
        raise AdminTokenError("give --admin-token or --admin-token-file, not both")
    if token_file:
        return validate_admin_token(
            _read_token_file(token_file), f"--admin-token-file {token_file}"
        )
    if token:
        return validate_admin_token(token, "--admin-token")
    from_env = environ.get(ADMIN_TOKEN_ENV, "")
    if from_env:
        return validate_admin_token(from_env.strip(), ADMIN_TOKEN_ENV)
    return None


def admin_policy(
    enable_admin_ops: bool,
    enable_http_cache_clear: bool,
    token: str | None,
    token_file: str | None,
    environ: Mapping[str, str],
) -> AdminPolicy:
    """The server's policy from its flags; raises :class:`AdminTokenError`."""
    resolved = resolve_admin_token(token, token_file, environ)
    if resolved is not None and not (enable_admin_ops or enable_http_cache_clear):
        logger.warning(
            "an admin token is configured, but neither --enable-admin-ops nor "
            "--enable-http-cache-clear is set: admin operations stay off"
        )
    return AdminPolicy(wire_enabled=enable_admin_ops, token=resolved)


# -- exposed listeners -----------------------------------------------------------------------


def is_loopback_host(host: str) -> bool:
    """True only when every address ``host`` names is a loopback address.

    Wildcards (``0.0.0.0``, ``::``, ``*``), LAN addresses, interface names and names that
    do not resolve are not loopback: when in doubt, the caller warns.
    """
    name = host.strip().strip("[]")
    if not name or name == "*":
        return False
    try:
        return ipaddress.ip_address(name.split("%", 1)[0]).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None)
    except (OSError, UnicodeError):
        return False
    addresses = {str(info[4][0]).split("%", 1)[0] for info in infos}
    try:
        return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)
    except ValueError:
        return False


def warn_if_exposed(listener: str, host: str, port: int, reachable: str) -> bool:
    """Log a warning when ``listener`` binds a non-loopback address; True when it did.

    ``reachable`` says what a peer that can reach the port may do there.
    """
    if is_loopback_host(host):
        return False
    logger.warning(
        "%s listens on %s:%d, which is not a loopback address: any host that can reach it "
        "can %s. Restrict who can reach the port (firewall, Kubernetes NetworkPolicy) or "
        "bind 127.0.0.1; see %s",
        listener,
        host,
        port,
        reachable,
        THREAT_MODEL_DOC,
    )
    return True


def check_run_script_exposure(
    run_script_enabled: bool, http_host: str, http_port: int, policy: AdminPolicy
) -> None:
    """``POST /run_script`` runs uploaded code in the server; the restricted builtins are
    not a sandbox.  On an HTTP frontend bound beyond loopback it therefore needs an admin
    token: without one, raises ``ValueError`` (start-up is refused before anything binds)."""
    if not run_script_enabled or not http_port or policy.token is not None:
        return
    if is_loopback_host(http_host):
        return
    raise ValueError(
        f"--run-script-api-enabled on --http-host {http_host}, which is not a loopback "
        f"address, needs an admin token (--admin-token-file, --admin-token or "
        f"{ADMIN_TOKEN_ENV}): without one any host that can reach port {http_port} could run "
        f"code in this server. Configure a token or bind --http-host 127.0.0.1; see "
        f"{THREAT_MODEL_DOC}"
    )


def rpc_reach(policy: AdminPolicy) -> str:
    """What a peer on the ZMQ RPC port may do, for :func:`warn_if_exposed`."""
    reach = (
        "store and read KV cache chunks and unregister workers, in clear text "
        "(no --curve-secret-key-file / --authorized-keys)"
    )
    if policy.wire_enabled and policy.token is None:
        reach += ", and wipe the whole cache (--enable-admin-ops without an admin token)"
    return reach


def http_reach(policy: AdminPolicy, allow_cache_clear: bool, allow_run_script: bool = False) -> str:
    """What a peer on the HTTP frontend may do, for :func:`warn_if_exposed`."""
    reach = "read /status (worker and model names), /metrics, /config and thread stacks"
    if policy.token is None:
        reach += ", read /env (secrets redacted), read and change log levels"
    if allow_cache_clear and policy.token is None:
        reach += ", and wipe the whole cache (--enable-http-cache-clear without an admin token)"
    if allow_run_script and policy.token is None:
        reach += (
            ", and run Python code in the server (--run-script-api-enabled without an admin token)"
        )
    return reach
