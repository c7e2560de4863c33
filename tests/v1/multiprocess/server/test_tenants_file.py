"""``--tenants-file``: parsing, the checks that refuse a bad file, the quota pairs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import zmq

from lmcache.v1.multiprocess.server.tenants import (
    TenantsFileError,
    load_tenants,
    quota_registrations,
    tenants_from_flags,
)

ALICE, BOB = zmq.curve_keypair()[0], zmq.curve_keypair()[0]
AUTHORIZED = {ALICE: "alice", BOB: "bob"}


def _write(tmp_path: Path, tenants: dict[str, Any], suffix: str = ".json") -> Path:
    path = tmp_path / f"tenants{suffix}"
    path.write_text(json.dumps({"tenants": tenants}))
    return path


def _two(**a: Any) -> dict[str, Any]:
    return {"a": {"keys": ["alice"], "salts": ["a"]} | a, "b": {"keys": ["bob"], "salts": ["b"]}}


def test_yaml_file_with_key_names_and_z85_keys(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "tenants:\n"
        "  a: {keys: [alice], salts: [a, a2], quota_bytes: 1024, models: [m], shares: [p]}\n"
        f"  b: {{keys: ['{BOB.decode()}'], salt_prefix: b-}}\n"
    )
    table = load_tenants(path, AUTHORIZED)
    a, b = table.for_key(ALICE.decode()), table.for_key(BOB.decode())
    assert a is not None and b is not None
    assert a.default_salt == "a" and b.default_salt == "b-"
    assert a.may_use_model("m") and not a.may_use_model("x") and b.may_use_model("x")
    assert a.may_read("p") and not a.owns("p") and b.owns("b-anything")
    assert quota_registrations(table) == [("a", 1024), ("a2", 1024)]
    assert quota_registrations(None) == []


@pytest.mark.parametrize(
    ("tenants", "message"),
    [
        ({"a": {"keys": ["alice"], "salts": ["a"]}}, "belong to no tenant"),
        (_two(salts=["b"]), "both own"),
        (
            {"a": {"keys": ["alice"], "salt_prefix": "x"},
             "b": {"keys": ["bob"], "salt_prefix": "xy"}},
            "both own",
        ),
        (_two(keys=["alice", "bob"]), "belongs to tenants"),
        (_two(keys=["carol"]), "neither the name"),
        (_two(colour="red"), "unknown field"),
        (_two(salts=[]), "give the salts"),
        (_two(default_salt="z"), "not one of its salts"),
        (_two(quota_bytes=-1), "quota_bytes"),
        (_two(admin="yes"), "admin must be"),
        (_two(salts=["a/b"]), "may not contain"),
    ],
)  # fmt: skip
def test_bad_files_are_refused_with_the_reason(
    tmp_path: Path, tenants: dict[str, Any], message: str
) -> None:
    with pytest.raises(TenantsFileError, match=message):
        load_tenants(_write(tmp_path, tenants), AUTHORIZED)


def test_unreadable_or_shapeless_files(tmp_path: Path) -> None:
    with pytest.raises(TenantsFileError, match="cannot read"):
        load_tenants(tmp_path / "missing.yaml", AUTHORIZED)
    (tmp_path / "x.yaml").write_text("just: text\n")
    with pytest.raises(TenantsFileError, match="top-level 'tenants'"):
        load_tenants(tmp_path / "x.yaml", AUTHORIZED)
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(TenantsFileError, match="not valid JSON"):
        load_tenants(tmp_path / "x.json", AUTHORIZED)


def test_tenants_need_curve_keys(tmp_path: Path) -> None:
    assert tenants_from_flags(None, None) is None
    with pytest.raises(TenantsFileError, match="needs --curve-secret-key-file"):
        tenants_from_flags(str(_write(tmp_path, _two())), None)


def test_every_operation_has_a_tenant_rule() -> None:
    """A new operation must decide what a tenant may do with it."""
    from lmcache.v1.multiprocess.server.tenants import TENANT_RULES
    from lmcache.v1.multiprocess.wire.protocol import RPC_SPECS

    assert set(TENANT_RULES) == set(RPC_SPECS)


def test_register_quotas_sets_each_pair(tmp_path: Path) -> None:
    from lmcache.v1.multiprocess.server.tenants import register_quotas

    class Quotas:
        def __init__(self) -> None:
            self.limits: dict[str, int] = {}

        def set_quota(self, cache_salt: str, limit_bytes: int) -> None:
            self.limits[cache_salt] = limit_bytes

    table = load_tenants(_write(tmp_path, _two(quota_bytes=4096)), AUTHORIZED)
    quotas = Quotas()
    assert register_quotas(table, quotas) == 1
    assert quotas.limits == {"a": 4096}
