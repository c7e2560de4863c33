"""Find and redact secrets in JSON-like documents (configuration reports, environments).

A secret is found by name and by shape:

* a mapping key whose words (``snake_case``, ``camelCase``, dotted or dashed) include
  ``password``, ``secret``, ``token``, ``credential(s)``, ``passphrase``, ``authorization``
  (also run together: ``PGPASSWORD``, ``sslpassword``) or ``api key`` / ``access key`` /
  ``private key``, or that ends in ``key`` (``OPENAI_KEY``; not a ``public``, ``primary``,
  ``sort``, ... key), ``pass`` (``DB_PASS``), ``pwd`` (``DB_PWD``, but not the shell's
  ``PWD``) or ``auth`` (``AUTH``, ``REDIS_AUTH``), has its value replaced by
  :data:`REDACTED` -- unless the key names where a secret is kept (last word ``file``,
  ``path`` or ``dir``) or the value says nothing (``None``, a boolean);
* in a string: a URL's user information (``redis://user:pw@host`` keeps ``user``; the
  password may hold a raw ``/`` or ``@``), secret-named ``name=value`` pairs (URL query
  parameters, libpq DSNs such as ``host=db password=x``, ``name: value``), the credential
  after ``Bearer`` / ``Basic``, and a string holding a JSON object is redacted inside.

Redaction errs towards hiding: a URL with an ``@`` in its path may lose part of that path.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REDACTED", "is_secret_key", "redact_secrets"]

REDACTED = "***"  # what RedisSettings.redacted() writes too

_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "credential",
        "credentials",
        "authorization",
        "apikey",
    }
)
# Run-together names: PGPASSWORD, sslpassword, CLIENTSECRET, csrftoken.
_SECRET_SUFFIXES = ("password", "passwd", "passphrase", "secret", "token", "apikey")
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key")})
# Last words that make a secret on their own ("AUTH", "DB_PASS"); "pwd" only after another
# word, because the shell's PWD is the working directory.
_SECRET_LAST_WORDS = frozenset({"pass", "auth", "key", "keys"})
_SECRET_LAST_WORDS_AFTER_ANOTHER = frozenset({"pwd"})
# Keys that name a lookup key, not a credential ("sort_key", "lookup_ipc_key").
_NON_SECRET_KEY_KINDS = frozenset(
    {
        "public",
        "primary",
        "sort",
        "partition",
        "routing",
        "cache",
        "hash",
        "affinity",
        "foreign",
        "shard",
        "lookup",
        "ipc",
        "chunk",
        "object",
        "row",
        "group",
        "index",
    }
)
# ``admin_token_file`` names where the token is, which an operator needs to see.
_LOCATION_WORDS = frozenset({"file", "path", "dir"})
_CAMEL_BOUNDARY = re.compile(r"([a-z0-9])([A-Z])")
# Up to the last "@" before whitespace or the next URL, so a password may hold "/" or "@".
_URL_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>(?:(?!://)[^\s@])*(?:@(?:(?!://)[^\s@])*)*)@"
)
# name=value (query parameters, libpq DSNs, "k=v;k=v") and "name: value"; the value may be
# quoted, or a "Bearer <credential>" pair.
_NAMED_VALUE = re.compile(
    r"(?P<lead>^|[\s?&;,{])(?P<name>[A-Za-z_][\w.-]*)(?P<sep>\s*(?:=|:(?!//))\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|(?:bearer|basic)\s+[^\s&;,]+|[^\s&;,]*)",
    re.IGNORECASE,
)
_AUTH_SCHEME_CREDENTIAL = re.compile(
    r"(?P<scheme>\b(?:bearer|basic)\s+)(?P<credential>[A-Za-z0-9._~+/=-]{8,})", re.IGNORECASE
)


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", _CAMEL_BOUNDARY.sub(r"\1_\2", name).lower()) if w]


def is_secret_key(name: str) -> bool:
    """Whether a configuration key ``name`` holds a secret (see the module docstring)."""
    words = _words(name)
    if not words or words[-1] in _LOCATION_WORDS:
        return False
    if any(word in _SECRET_WORDS or word.endswith(_SECRET_SUFFIXES) for word in words):
        return True
    if any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words)):
        return True
    last = words[-1]
    if last in _SECRET_LAST_WORDS_AFTER_ANOTHER:
        return len(words) > 1
    if last in ("key", "keys"):
        return len(words) > 1 and words[-2] not in _NON_SECRET_KEY_KINDS
    return last in _SECRET_LAST_WORDS


def redact_secrets(value: Any) -> Any:
    """A copy of the JSON-like ``value`` (dicts, lists, scalars) with its secrets redacted."""
    if isinstance(value, Mapping):
        return {
            key: _redact_entry(str(key), item) if isinstance(key, str) else redact_secrets(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_secrets(item) for item in value]
    if isinstance(value, str):
        return _redact_string(value)
    return value


def _redact_entry(key: str, value: Any) -> Any:
    if is_secret_key(key) and value is not None and not isinstance(value, bool):
        return REDACTED
    return redact_secrets(value)


def _redact_json_object(text: str) -> str | None:
    """``text`` redacted inside when it holds a JSON object; None when it does not."""
    stripped = text.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return None
    try:
        parsed = json.loads(stripped)
    except (ValueError, RecursionError):
        return None
    if not isinstance(parsed, dict):
        return None
    cleaned = redact_secrets(parsed)
    return text if cleaned == parsed else json.dumps(cleaned)


def _redact_userinfo(match: re.Match[str]) -> str:
    user, colon, _password = match["userinfo"].partition(":")
    if colon:
        # "user:password@" keeps the user (the password may hold "/" or "@").
        return f"{match['scheme']}{user}:{REDACTED}@"
    if "/" in user:
        return match[0]  # an "@" in the path ("https://host/@name"), not credentials
    return f"{match['scheme']}{REDACTED}@"  # a lone "<x>@" may be a token


def _redact_named_values(text: str) -> str:
    """Each secret-named pair's value redacted.  A pair whose name is not secret gives up
    only its name, so a pair inside its value (``next=https://h/?token=x``) is still seen."""
    parts: list[str] = []
    done = position = 0
    while (match := _NAMED_VALUE.search(text, position)) is not None:
        if match["value"] and is_secret_key(match["name"]):
            parts += [text[done : match.start("value")], REDACTED]
            done = position = match.end()
        else:
            position = max(match.end("sep"), position + 1)
    return "".join(parts) + text[done:]


def _redact_string(text: str) -> str:
    inside_json = _redact_json_object(text)
    if inside_json is not None:
        return inside_json
    text = _URL_USERINFO.sub(_redact_userinfo, text)
    text = _redact_named_values(text)
    return _AUTH_SCHEME_CREDENTIAL.sub(lambda m: f"{m['scheme']}{REDACTED}", text)
