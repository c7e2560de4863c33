"""Upstream's ``lmcache.v1.distributed.config``: the server's own storage flags, read into
upstream's ``StorageManagerConfig`` view."""

from __future__ import annotations

import argparse
import json

import pytest

from lmcache.v1.distributed.config import (
    EvictionConfig,
    add_storage_manager_args,
    parse_args,
    parse_args_to_config,
)
from lmcache.v1.multiprocess.server_flags import add_mp_server_args


def test_upstream_storage_command_line_reads_as_upstreams_config() -> None:
    parser = add_storage_manager_args(argparse.ArgumentParser())
    args = parser.parse_args(
        ["--l1-size-gb", "2", "--eviction-policy", "arc", "--eviction-trigger-watermark",
         "0.9", "--eviction-ratio", "0.1", "--l2-store-policy", "skip_l1", "--no-l1-use-lazy",
         "--l2-adapter", json.dumps({"type": "mock", "max_size_gb": 1, "mock_bandwidth_gb": 1})]
    )  # fmt: skip
    config = parse_args_to_config(args)
    assert config.eviction_config == EvictionConfig("ARC", 0.9, 0.1)
    assert config.l1_size_gb == 2.0
    assert config.store_policy == "skip_l1" and config.prefetch_policy == "default"
    assert config.l1_settings.use_lazy is False
    assert config.l1_settings.eviction_trigger_watermark == 0.9
    assert config.l1_settings.eviction_ratio == 0.1
    assert [type(a).__name__ for a in config.l2_adapter_config.adapters] == ["MockL2AdapterConfig"]


def test_the_flags_are_the_servers_own() -> None:
    """One definition: every storage flag's default here is the server's."""
    ours = vars(add_mp_server_args(argparse.ArgumentParser()).parse_args([]))
    upstream = vars(add_storage_manager_args(argparse.ArgumentParser()).parse_args([]))
    shared = set(upstream) - {"_explicit_flags"}
    assert shared and shared <= set(ours)
    assert {k: upstream[k] for k in shared} == {k: ours[k] for k in shared}


def test_bad_values_are_refused_with_the_flag() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--eviction-ratio", "1.5"])
