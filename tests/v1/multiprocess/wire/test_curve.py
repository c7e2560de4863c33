"""CURVE key files and the ZAP handler (lmcache.v1.multiprocess.wire.curve), in process."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import zmq
import zmq.auth
from zmq.utils import z85

from lmcache.v1.multiprocess.wire import curve


def test_key_pair_files_are_zmq_auth_certificates_and_the_secret_is_private(
    tmp_path: Path,
) -> None:
    public, secret = curve.write_key_pair(tmp_path / "keys", "alice")
    assert (public.name, secret.name) == ("alice.key", "alice.key_secret")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    pub, sec = zmq.auth.load_certificate(secret)
    assert sec is not None and zmq.curve_public(sec) == pub
    assert zmq.auth.load_certificate(public) == (pub, None)
    assert curve.read_key_file(secret, need_secret=True) == (pub, sec)


def test_secret_file_is_0600_even_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        _public, secret = curve.write_key_pair(tmp_path, "loose")
    finally:
        os.umask(old)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


def test_existing_files_are_never_overwritten(tmp_path: Path) -> None:
    curve.write_key_pair(tmp_path, "alice")
    before = (tmp_path / "alice.key_secret").read_bytes()
    with pytest.raises(curve.CurveKeyError, match="exists"):
        curve.write_key_pair(tmp_path, "alice")
    assert (tmp_path / "alice.key_secret").read_bytes() == before


@pytest.mark.parametrize("name", ["", "a/b", ".hidden", " x"])
def test_bad_key_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(curve.CurveKeyError, match="key name"):
        curve.write_key_pair(tmp_path, name)


def test_zmq_auth_made_certificates_load(tmp_path: Path) -> None:
    public_file, secret_file = zmq.auth.create_certificates(str(tmp_path), "server")
    keys = curve.CurveServerKeys.from_files(secret_file, tmp_path)
    assert keys.public == zmq.auth.load_certificate(public_file)[0]
    assert set(keys.authorized.values()) == {"server"}


def test_public_file_where_a_secret_is_needed_names_the_file(tmp_path: Path) -> None:
    public, _secret = curve.write_key_pair(tmp_path, "alice")
    with pytest.raises(curve.CurveKeyError, match=r"alice\.key.*no secret key"):
        curve.read_key_file(public, need_secret=True)


def test_malformed_key_files_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text('curve\n    public-key = "short"\n')
    with pytest.raises(curve.CurveKeyError, match="40"):
        curve.read_key_file(bad, need_secret=False)
    bad.write_text("nothing here\n")
    with pytest.raises(curve.CurveKeyError, match="no public-key"):
        curve.read_key_file(bad, need_secret=False)
    with pytest.raises(curve.CurveKeyError, match="cannot read"):
        curve.read_key_file(tmp_path / "missing.key", need_secret=False)


def test_mismatched_public_and_secret_are_refused(tmp_path: Path) -> None:
    _p, secret = curve.write_key_pair(tmp_path, "a")
    other_public, _s = zmq.curve_keypair()
    text = secret.read_text().replace(
        curve.read_key_file(secret, need_secret=False)[0].decode(), other_public.decode()
    )
    secret.chmod(0o600)
    secret.write_text(text)
    with pytest.raises(curve.CurveKeyError, match="does not belong"):
        curve.read_key_file(secret, need_secret=True)


def test_authorized_keys_directory_must_hold_keys(tmp_path: Path) -> None:
    with pytest.raises(curve.CurveKeyError, match="not a directory"):
        curve.load_authorized_keys(tmp_path / "nope")
    with pytest.raises(curve.CurveKeyError, match="no client could"):
        curve.load_authorized_keys(tmp_path)


def test_server_flags_come_together(tmp_path: Path) -> None:
    _public, secret = curve.write_key_pair(tmp_path, "server")
    assert curve.server_keys_from_files(None, None) is None
    with pytest.raises(curve.CurveKeyError, match="together"):
        curve.server_keys_from_files(str(secret), None)
    with pytest.raises(curve.CurveKeyError, match="together"):
        curve.server_keys_from_files(None, str(tmp_path))
    assert curve.client_keys_from_files(None, None, "x") is None
    with pytest.raises(curve.CurveKeyError, match="both"):
        curve.client_keys_from_files(str(secret), None, "x")


def _zap_request(mechanism: bytes, key: bytes | None) -> list[bytes]:
    creds = [z85.decode(key)] if key is not None else []
    return [b"1.0", b"7", b"lmcache", b"10.0.0.9", b"", mechanism, *creds]


def test_zap_admits_listed_keys_with_the_key_as_user_id(tmp_path: Path) -> None:
    listed, _ = zmq.curve_keypair()
    stranger, _ = zmq.curve_keypair()
    refused: list[str] = []
    ctx = zmq.Context()
    zap = curve.ZapHandler(ctx, {listed: "alice"}, on_refusal=refused.append)
    try:
        req = ctx.socket(zmq.REQ)
        req.connect(curve.ZAP_ENDPOINT)
        answers = []
        for request in (
            _zap_request(b"CURVE", listed),
            _zap_request(b"CURVE", stranger),
            _zap_request(b"NULL", None),
        ):
            req.send_multipart(request)
            assert req.poll(2000)
            answers.append(req.recv_multipart())
        req.close(0)
    finally:
        zap.close()
        ctx.term()
    assert answers[0][2:5] == [b"200", b"OK", listed]
    assert answers[1][2] == b"400" and answers[1][4] == b""
    assert answers[2][2] == b"400"
    assert (zap.admitted, zap.refused) == (1, 2)
    assert refused == ["CURVE", "NULL"]
