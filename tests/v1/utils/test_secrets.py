"""``lmcache.v1.utils.secrets``: what ``/env`` and ``/config`` hide, by variable name and by
value shape, and what they must leave readable."""

from __future__ import annotations

import pytest

from lmcache.v1.utils.secrets import REDACTED, is_secret_key, redact_secrets

SECRET = "s3cr3t-Value-0123"


@pytest.mark.parametrize(
    "name",
    [
        "OPENAI_KEY",
        "OPENAI_API_KEY",
        "ANTHROPIC_KEY",
        "SSH_KEYS",
        "DB_PASS",
        "MYSQL_ROOT_PASS",
        "DB_PWD",
        "AUTH",
        "REDIS_AUTH",
        "basicAuth",
        "SECRET_ENV",
        "GITHUB_TOKEN",
        "PGPASSWORD",
        "SSLPASSWORD",
        "CLIENTSECRET",
        "DB_PASSWORD",
        "AWS_SECRET_ACCESS_KEY",
        "HTTP_AUTHORIZATION",
        "client-secret",
        "secretKey",
    ],
)
def test_secret_variable_names_are_redacted(name: str) -> None:
    assert is_secret_key(name), name
    assert redact_secrets({name: SECRET}) == {name: REDACTED}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/home/lmcache"),
        ("LANG", "en_US.UTF-8"),
        ("PWD", "/work/repo"),
        ("OLDPWD", "/tmp"),
        ("HOSTNAME", "node-1"),
        ("SHELL", "/bin/bash"),
        ("LMCACHE_ADMIN_TOKEN_FILE", "/run/secrets/token"),
        ("SSL_KEYFILE", "/etc/ssl/key.pem"),
        ("MAX_TOKENS", "4096"),
        ("PUBLIC_KEY", "ssh-ed25519 AAAAC3Nza"),
        ("SORT_KEY", "created_at"),
        ("CACHE_KEY", "model/abc"),
        ("KEYSPACE", "lmcache"),
        ("PASSTHROUGH", "1"),
        ("BYPASS", "yes"),
        ("AUTH_TYPE", "basic"),
        ("KEY", "plain"),
        ("REDIS_URL", "redis://cache:6379/0"),
        ("HF_ENDPOINT", "https://hf.example:8443/models/a/b?rev=main"),
        ("PROFILE_URL", "https://example.com/people/@someone"),
        ("CONTACT", "ops@example.com"),
        ("LMCACHE_DSN_HOST", "host=db port=5432 dbname=kv"),
    ],
)
def test_plain_variables_stay_readable(name: str, value: str) -> None:
    assert redact_secrets({name: value}) == {name: value}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # URL user information: the user stays, the password goes, "/" and "@" included.
        (f"redis://alice:{SECRET}@cache:6379/0", f"redis://alice:{REDACTED}@cache:6379/0"),
        ("redis://alice:pa/ss@cache:6379/0", f"redis://alice:{REDACTED}@cache:6379/0"),
        ("redis://alice:p@ss@cache:6379/0", f"redis://alice:{REDACTED}@cache:6379/0"),
        ("redis://alice:a/b@c@cache/0", f"redis://alice:{REDACTED}@cache/0"),
        ("redis://:p@ss/w@cache", f"redis://:{REDACTED}@cache"),
        ("redis://tok3n@host", f"redis://{REDACTED}@host"),
        (
            "redis://a:one/x@h1:6379,redis://b:two@x@h2:6379",
            f"redis://a:{REDACTED}@h1:6379,redis://b:{REDACTED}@h2:6379",
        ),
        # libpq DSNs and other name=value strings.
        ("host=db password=x user=u", f"host=db password={REDACTED} user=u"),
        ("host=db password = 'a b c' user=u", f"host=db password = {REDACTED} user=u"),
        ("host=db sslpassword=x", f"host=db sslpassword={REDACTED}"),
        ("Server=db;Password=pw;Database=kv", f"Server=db;Password={REDACTED};Database=kv"),
        (
            "https://s3.example/b?X-Amz-Credential=abc&api_key=k&n=1",
            f"https://s3.example/b?X-Amz-Credential={REDACTED}&api_key={REDACTED}&n=1",
        ),
        ("next=https://h/?token=abc&page=2", f"next=https://h/?token={REDACTED}&page=2"),
        # Credentials after an HTTP auth scheme.
        ("Authorization=Bearer abcdefgh12345", f"Authorization={REDACTED}"),
        ("authorization: Basic dXNlcjpwYXNz", f"authorization: {REDACTED}"),
        ("x-extra=1,Bearer abcdefgh12345", f"x-extra=1,Bearer {REDACTED}"),
        # A JSON object in a string is redacted inside.
        ('{"user": "u", "password": "x"}', f'{{"user": "u", "password": "{REDACTED}"}}'),
    ],
)
def test_secret_shapes_inside_values_are_redacted(value: str, expected: str) -> None:
    assert redact_secrets({"LMC_PLAIN_NAME": value}) == {"LMC_PLAIN_NAME": expected}


def test_nothing_but_the_secret_is_lost() -> None:
    env = {
        "DATABASE_URL": "postgresql://app:pa/ss@w0rd@db.internal:5432/kv?sslmode=require",
        "PG_DSN": "host=db.internal port=5432 user=app password=hunter2 dbname=kv",
        "OPENAI_KEY": "sk-test-123",
        "PATH": "/usr/bin",
    }
    shown = redact_secrets(env)
    assert shown == {
        "DATABASE_URL": f"postgresql://app:{REDACTED}@db.internal:5432/kv?sslmode=require",
        "PG_DSN": f"host=db.internal port=5432 user=app password={REDACTED} dbname=kv",
        "OPENAI_KEY": REDACTED,
        "PATH": "/usr/bin",
    }
    text = repr(shown)
    for leaked in ("pa/ss", "w0rd", "hunter2", "sk-test"):
        assert leaked not in text
