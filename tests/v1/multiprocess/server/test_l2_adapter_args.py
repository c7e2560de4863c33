"""``--l2-adapter`` parsing: upstream's JSON form, clear errors for bad input."""

from __future__ import annotations

import pytest

from lmcache.v1.multiprocess.server.startup import parse_l2_adapter
from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.storage_backend.tier_settings import disk_tier


def test_resp_adapter_parses() -> None:
    spec = parse_l2_adapter('{"type": "resp", "url": "redis://127.0.0.1:6379"}')
    assert spec["type"] == "resp"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", 'must be a JSON object with a "type"'),
        ('{"type": "nope"}', "type 'nope' is not supported"),
        ('{"type": "s3"}', "type 's3' is not available here: it needs an S3 object store"),
        ('{"type": "dax"}', "needs a DAX"),
    ],
)
def test_bad_adapter_is_a_clear_error(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_l2_adapter(raw)


def test_disk_adapter_becomes_the_disk_tier() -> None:
    spec = parse_l2_adapter('{"type": "disk", "path": "/data", "size_gb": 3}')
    assert disk_tier(None, 0.0, [spec]) == ("/data", 3.0)


def test_two_disk_tiers_are_refused() -> None:
    raw = '{"type": "disk", "path": "/data"}'
    config = MPServerConfig(
        l1_size_gb=0.01, l2_disk_path="/other", l2_disk_size_gb=1.0, l2_adapters=[raw]
    )
    with pytest.raises(ValueError, match="only one disk tier"):
        config.tier_settings()


def test_disk_adapter_needs_a_path() -> None:
    with pytest.raises(ValueError, match='needs a "path"'):
        disk_tier(None, 0.0, [parse_l2_adapter('{"type": "fs"}')])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            '{"type": "mock", "max_size_gb": 1, "mock_bandwidth_gb": 1, '
            '"eviction": {"eviction_policy": "ARC"}}',
            "'ARC' is not available on L2 adapter tiers yet",
        ),
        ('{"type": "mock", "max_size_gb": 1}', "mock_bandwidth_gb must be a positive number"),
        (
            '{"type": "fault_inject", "inner": {"type": "resp", "url": "redis://h"}}',
            "unknown L2 adapter type 'resp'",
        ),
    ],
)
def test_adapter_interface_specs_are_checked_before_start(spec: str, message: str) -> None:
    config = MPServerConfig(l1_size_gb=0.01, l2_adapters=[spec])
    with pytest.raises(ValueError, match=message):
        config.tier_settings()
