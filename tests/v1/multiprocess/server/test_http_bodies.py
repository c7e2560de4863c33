"""Every route of the HTTP frontend that takes a body answers a malformed one with a 400
JSON ``{"error": "bad_request", "message": ...}`` (413 when it is too large), never a 500:
deep nesting, wrong types, invalid UTF-8, huge numbers, truncated or foreign encodings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from lmcache.compat.upstream_056.http_api_registry import HTTPAPIRegistry
from lmcache.v1.multiprocess.server import MPCacheServer
from lmcache.v1.multiprocess.server.http_frontend import MAX_CLEAR_BODY_BYTES, build_app

# Deeper than json.loads recurses (it raises RecursionError), within the 4 KiB body cap.
DEEP = 2_000
JSON = {"content-type": "application/json"}

CLEAR_BODIES: list[tuple[str, bytes]] = [
    ("deep-array", b"[" * DEEP + b"]" * DEEP),
    ("deep-array-in-force", b'{"force": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
    ("deep-object", b'{"a":' * 600 + b"1" + b"}" * 600),
    ("deep-in-unknown-field", b'{"a": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
    ("deep-unterminated", b"[" * DEEP),
    ("force-string", b'{"force": "yes"}'),
    ("force-int", b'{"force": 1}'),
    ("force-null", b'{"force": null}'),
    ("list", b"[true]"),
    ("string", b'"force"'),
    ("null", b"null"),
    ("number", b"3"),
    ("unknown-field", b'{"force": true, "tier": "l1"}'),
    ("invalid-utf8-in-string", b'{"force": "\xff\xfe"}'),
    ("invalid-utf8-key", b'{"\xc3\x28": true}'),
    ("utf16", '{"force": true}'.encode("utf-16")),
    ("bom", b'\xef\xbb\xbf{"force": true}'),
    ("huge-float", b'{"force": 1e999999}'),
    ("huge-int", b'{"force": ' + b"9" * 4_000 + b"}"),
    ("nan", b'{"force": NaN}'),
    ("infinity", b'{"force": -Infinity}'),
    ("truncated", b'{"force": tr'),
    ("trailing", b'{"force": true} {"force": false}'),
    ("binary", bytes(range(256))),
    ("nul", b"\x00" * 64),
]


@pytest.fixture
def engine(make_engine: Callable[..., MPCacheServer]) -> MPCacheServer:
    return make_engine(enable_http_cache_clear=True, run_script_api_enabled=True)


def _frontend(engine: MPCacheServer) -> TestClient:
    return TestClient(build_app(engine, allow_cache_clear=True), raise_server_exceptions=False)


def _upstream_shaped(engine: MPCacheServer) -> TestClient:
    app = FastAPI()
    HTTPAPIRegistry(app).register_all_apis()
    app.state.engine = engine
    app.state.allow_cache_clear = True
    app.state.configs = {"mp": engine.server_config}
    return TestClient(app, raise_server_exceptions=False)


APPS: dict[str, Callable[[MPCacheServer], TestClient]] = {
    "frontend": _frontend,
    "http_api_registry": _upstream_shaped,
}


def _assert_json_error(reply: Any, status: int) -> dict[str, Any]:
    assert reply.status_code == status, reply.text[:300]
    assert reply.headers["content-type"].startswith("application/json"), reply.headers
    body = reply.json()
    assert body["error"] in ("bad_request", "payload_too_large"), body
    assert body["message"], body
    return dict(body)


@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize(("case", "body"), CLEAR_BODIES, ids=[c for c, _ in CLEAR_BODIES])
def test_malformed_clear_bodies_are_400_json(
    engine: MPCacheServer, app: str, case: str, body: bytes
) -> None:
    client = APPS[app](engine)
    _assert_json_error(client.post("/cache/clear", content=body, headers=JSON), 400)
    # The server still answers, and a good body still clears.
    good = client.post("/cache/clear", json={"force": True})
    assert good.status_code == 200 and good.json()["force"] is True


@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize(
    "body",
    [
        b'{"force": true' + b" " * MAX_CLEAR_BODY_BYTES + b"}",
        b"[" * 1_000_000,
        b"x" * (8 << 20),
    ],
    ids=["padded", "deep-1M", "8MiB"],
)
def test_an_oversized_clear_body_is_413_json(engine: MPCacheServer, app: str, body: bytes) -> None:
    reply = APPS[app](engine).post("/cache/clear", content=body, headers=JSON)
    _assert_json_error(reply, 413)
    assert str(MAX_CLEAR_BODY_BYTES) in reply.json()["message"]


@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize("body", [b"", b"{}", b'{"force": false}', b'  {"force": true}\n'])
def test_well_formed_clear_bodies_are_accepted(
    engine: MPCacheServer, app: str, body: bytes
) -> None:
    reply = APPS[app](engine).post("/cache/clear", content=body, headers=JSON)
    assert reply.status_code == 200, reply.text


BOUNDARY = "lmc-test-boundary"
MULTIPART = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}


def _part(name: bytes, payload: bytes, filename: bytes | None = b"s.py") -> bytes:
    disposition = b'form-data; name="' + name + b'"'
    if filename is not None:
        disposition += b'; filename="' + filename + b'"'
    return (
        b"--" + BOUNDARY.encode() + b"\r\nContent-Disposition: " + disposition + b"\r\n\r\n"
        + payload + b"\r\n"
    )  # fmt: skip


END = b"--" + BOUNDARY.encode() + b"--\r\n"

SCRIPT_BODIES: list[tuple[str, dict[str, str], bytes]] = [
    ("empty", MULTIPART, b""),
    ("no-script-field", MULTIPART, _part(b"other", b"result = 1") + END),
    ("script-as-text-field", MULTIPART, _part(b"script", b"result = 1", filename=None) + END),
    ("truncated-multipart", MULTIPART, _part(b"script", b"result = 1")[:-10]),
    ("no-boundary", {"content-type": "multipart/form-data"}, _part(b"script", b"x") + END),
    ("wrong-boundary", {"content-type": "multipart/form-data; boundary=other"}, END),
    ("json-instead", JSON, b'{"script": "result = 1"}'),
    ("deep-json-instead", JSON, b"[" * DEEP),
    ("form-urlencoded", {"content-type": "application/x-www-form-urlencoded"}, b"script=%ff"),
    ("invalid-utf8-field-name", MULTIPART, _part(b"\xff\xfe", b"result = 1") + END),
    ("too-many-fields", MULTIPART, b"".join(_part(b"f", b"1", None) for _ in range(1100)) + END),
    ("binary", {"content-type": "application/octet-stream"}, bytes(range(256))),
    # The part is well formed but holds no Python: it cannot run, so it is the caller's error.
    ("invalid-utf8-source", MULTIPART, _part(b"script", b"result = '\xff\xfe'") + END),
    ("nul-in-source", MULTIPART, _part(b"script", b"result = 1\x00") + END),
    ("syntax-error", MULTIPART, _part(b"script", b"result = (") + END),
    ("deep-source", MULTIPART, _part(b"script", b"result = " + b"(" * 10_000) + END),
]


@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize(
    ("case", "headers", "body"), SCRIPT_BODIES, ids=[c for c, _, _ in SCRIPT_BODIES]
)
def test_malformed_run_script_bodies_are_400_json(
    engine: MPCacheServer, app: str, case: str, headers: dict[str, str], body: bytes
) -> None:
    client = APPS[app](engine)
    _assert_json_error(client.post("/run_script", content=body, headers=headers), 400)
    ok = client.post(
        "/run_script", content=_part(b"script", b"result = 6 * 7") + END, headers=MULTIPART
    )
    assert ok.status_code == 200 and ok.text == "42"


@pytest.mark.parametrize("app", APPS)
def test_a_filename_that_is_not_utf8_does_not_matter(engine: MPCacheServer, app: str) -> None:
    body = _part(b"script", b"result = 'ran'", b"\xff\xfe.py") + END
    reply = APPS[app](engine).post("/run_script", content=body, headers=MULTIPART)
    assert reply.status_code == 200 and reply.text == "ran"
