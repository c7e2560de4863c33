"""``lmcache keys new NAME`` / ``lmcache keys show FILE``."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import zmq.auth

from lmcache.cli.main import main


def test_keys_new_writes_a_pair_the_server_and_zmq_auth_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "new", "alice", "--dir", str(tmp_path)]) == 0
    secret = tmp_path / "alice.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    public, sec = zmq.auth.load_certificate(secret)
    assert sec is not None
    assert zmq.auth.load_certificate(tmp_path / "alice.key") == (public, None)
    assert "alice.key_secret" in capsys.readouterr().out
    assert main(["keys", "show", str(tmp_path / "alice.key")]) == 0
    assert capsys.readouterr().out.strip() == public.decode()


def test_keys_new_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "new", "alice", "--dir", str(tmp_path)]) == 0
    before = (tmp_path / "alice.key_secret").read_bytes()
    assert main(["keys", "new", "alice", "--dir", str(tmp_path)]) == 1
    assert "exists" in capsys.readouterr().err
    assert (tmp_path / "alice.key_secret").read_bytes() == before
