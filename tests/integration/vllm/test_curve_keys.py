"""``lmcache.mp.curve_*``: the connector's links speak CURVE to a keyed server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lmcache.integration.vllm.mp_client import ServerLink
from lmcache.integration.vllm.mp_config import parse_extra_config
from lmcache.v1.multiprocess.wire.curve import CurveKeyError, write_key_pair


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    server_public, server_secret = write_key_pair(tmp_path / "server", "server")
    _client_public, client_secret = write_key_pair(tmp_path / "authorized", "vllm")
    return {
        "server_public": server_public,
        "server_secret": server_secret,
        "authorized": tmp_path / "authorized",
        "client_secret": client_secret,
    }


def _extra(keys: dict[str, Path]) -> dict[str, str]:
    return {
        "lmcache.mp.mp_transfer_mode": "engine_driven",
        "lmcache.mp.curve_secret_key_file": str(keys["client_secret"]),
        "lmcache.mp.curve_server_key_file": str(keys["server_public"]),
    }


def test_curve_keys_are_read_from_extra_config(keys: dict[str, Path]) -> None:
    config = parse_extra_config(_extra(keys), env={})
    assert config.curve is not None
    assert parse_extra_config({}, env={}).curve is None
    half = {"lmcache.mp.curve_secret_key_file": str(keys["client_secret"])}
    with pytest.raises(CurveKeyError, match=r"lmcache\.mp\.curve"):
        parse_extra_config(half, env={})


def test_link_with_keys_reaches_a_keyed_server_and_one_without_does_not(
    keys: dict[str, Path], small_server: Callable[..., str]
) -> None:
    config = parse_extra_config(_extra(keys), env={})
    url = small_server(
        "--curve-secret-key-file",
        str(keys["server_secret"]),
        "--authorized-keys",
        str(keys["authorized"]),
        curve=config.curve,
    )
    keyed = ServerLink(url, 2.0, "", 16, curve=config.curve)
    assert keyed.open()
    keyed.close()
    plain = ServerLink(url, 1.0, "", 16)
    assert not plain.open(warn=False)
