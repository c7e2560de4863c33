"""Find and redact secrets in JSON-like documents (configuration reports, environments).

A secret is found by name and by shape:

* a mapping key whose words (``snake_case``, ``camelCase``, dotted or dashed) include
  ``password``, ``secret``, ``token``, ``credential(s)``, ``passphrase``, ``authorization``
  or ``api key`` / ``access key`` / ``private key`` has its value replaced by
  :data:`REDACTED` -- unless the key names where a secret is kept (last word ``file``,
  ``path``, ``dir`` or ``env``) or the value says nothing (``None``, a boolean);
* in a string, a URL's user information (``redis://user:pw@host`` keeps ``user``) and
  secret-named query parameters are redacted, and a string holding a JSON object is
  redacted inside.
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
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key")})
# ``admin_token_file`` names where the token is, which an operator needs to see.
_LOCATION_WORDS = frozenset({"file", "path", "dir", "env"})
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^@/\s?#]+)@")
_QUERY_PARAM = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&;#\s]+)=(?P<value>[^&;#\s]*)")
_CAMEL_BOUNDARY = re.compile(r"([a-z0-9])([A-Z])")


def is_secret_key(name: str) -> bool:
    """Whether a configuration key ``name`` holds a secret (see the module docstring)."""
    words = [w for w in re.split(r"[^a-z0-9]+", _CAMEL_BOUNDARY.sub(r"\1_\2", name).lower()) if w]
    if not words or words[-1] in _LOCATION_WORDS:
        return False
    if any(word in _SECRET_WORDS for word in words):
        return True
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


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


def _redact_string(text: str) -> str:
    stripped = text.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        try:
            parsed = json.loads(stripped)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            cleaned = redact_secrets(parsed)
            return text if cleaned == parsed else json.dumps(cleaned)

    def userinfo(match: re.Match[str]) -> str:
        user, colon, _password = match["userinfo"].partition(":")
        # "user:password@" keeps the user; a lone "<x>@" may be a token, so all of it goes.
        kept = f"{user}:{REDACTED}" if colon else REDACTED
        return f"{match['scheme']}{kept}@"

    def query(match: re.Match[str]) -> str:
        if not is_secret_key(match["name"]) or not match["value"]:
            return match[0]
        return f"{match['lead']}{match['name']}={REDACTED}"

    return _QUERY_PARAM.sub(query, _URL_USERINFO.sub(userinfo, text))
