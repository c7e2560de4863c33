"""Upstream 0.5.6's storage-manager flags on ``lmcache server``: accepted, validated, refused
with a reason where they need hardware this server lacks, and carried into the server's
storage (their effects in storage are tested in tests/v1/storage_backend/test_l1_settings.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from mp_server_helpers import ServerProcess, free_port

from lmcache.v1.multiprocess.server.handler import MPCacheServer
from lmcache.v1.multiprocess.server.pending import Pending
from lmcache.v1.multiprocess.server.startup import build_cache_server
from lmcache.v1.multiprocess.server_config import (
    MPServerConfig,
    add_mp_server_args,
    config_from_args,
)
from lmcache.v1.storage_backend.l1_settings import L1Settings

UPSTREAM_STORAGE_LINE = [
    "--eviction-trigger-watermark",
    "0.9",
    "--eviction-ratio",
    "0.1",
    "--l2-store-policy",
    "default",
    "--l1-use-lazy",
]


def _config(*argv: str) -> MPServerConfig:
    parser = argparse.ArgumentParser()
    add_mp_server_args(parser)
    return config_from_args(parser.parse_args(list(argv))).validate()


def test_upstreams_storage_flags_are_accepted_with_upstreams_defaults() -> None:
    config = _config()
    assert config.l1_settings() == L1Settings()  # upstream's defaults, field by field
    assert L1Settings() == L1Settings(
        eviction_trigger_watermark=0.8,
        eviction_ratio=0.2,
        read_ttl_seconds=300,
        write_ttl_seconds=600,
        use_lazy=True,
        init_size_gb=20,
        align_bytes=4096,
        use_hugepages=False,
        notifier_interval_ms=5,
    )
    assert (config.l2_store_policy, config.l2_prefetch_policy) == ("default", "default")
    assert config.l2_prefetch_max_in_flight == 8


def test_every_storage_flag_reaches_the_tier_settings() -> None:
    config = _config(
        "--l1-size-gb", "0.5",
        "--no-l1-use-lazy",
        "--l1-init-size-gb", "2",
        "--l1-align-bytes", "8192",
        "--l1-write-ttl-seconds", "30",
        "--l1-read-ttl-seconds", "20",
        "--eviction-trigger-watermark", "0.7",
        "--eviction-ratio", "0.3",
        "--l2-store-policy", "skip_l1",
        "--l2-prefetch-policy", "retain",
        "--l2-prefetch-max-in-flight", "3",
        "--periodic-notifier-interval-ms", "50",
    )  # fmt: skip
    tiers = config.tier_settings()
    assert tiers.store_policy == "skip_l1"
    assert tiers.l1 == L1Settings(
        eviction_trigger_watermark=0.7,
        eviction_ratio=0.3,
        read_ttl_seconds=20,
        write_ttl_seconds=30,
        use_lazy=False,
        init_size_gb=2,
        align_bytes=8192,
        notifier_interval_ms=50,
    )
    assert config.prepared_store_ttl_seconds() == 30  # below the pending timeout (60)
    assert config.l2_prefetch_policy == "retain" and config.l2_prefetch_max_in_flight == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--eviction-trigger-watermark", "0"], "--eviction-trigger-watermark"),
        (["--eviction-trigger-watermark", "1.2"], "--eviction-trigger-watermark"),
        (["--eviction-ratio", "0"], "--eviction-ratio"),
        (["--l1-align-bytes", "1000"], "--l1-align-bytes"),
        (["--l2-store-policy", "write_back"], "--l2-store-policy"),
        (["--l2-prefetch-policy", "lru"], "--l2-prefetch-policy"),
        (["--periodic-notifier-interval-ms", "0"], "--periodic-notifier-interval-ms"),
        (["--l1-read-ttl-seconds", "-1"], "--l1-read-ttl-seconds"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _config(*argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, reason",
    [
        (["--l1-devdax-path", "/dev/dax0.0"], "--l1-devdax-path: refused: a Device-DAX L1"),
        (["--gds-l1-path", "/nvme"], "--gds-l1-path: refused: a GPUDirect-Storage L1"),
        (["--gds-l1-use-direct-io"], "--gds-l1-use-direct-io: refused"),
        (["--gds-l1-backend", "auto"], "--gds-l1-backend: refused"),
        (["--l1-manager", '{"type": "DEVDAX", "tag": "d", "size_gb": 1}'], "DEVDAX is refused"),
        (["--l1-manager", '{"type": "GDS", "tag": "g", "size_gb": 1}'], "GDS is refused"),
        (["--l1-use-hugepages"], "--shm-name ''"),
        (
            ["--l1-manager", '{"type":"DRAM","tag":"a","size_gb":1}'] * 2,
            "this server has one L1",
        ),
        (
            ["--l1-size-gb", "1", "--l1-manager", '{"type":"DRAM","tag":"a","size_gb":1}'],
            "either --l1-manager or --l1-size-gb",
        ),
        (["--l1-manager", '{"type":"DRAM","tag":"a","size_gb":1,"x":1}'], "unknown fields"),
    ],
)
def test_what_needs_missing_hardware_is_refused_with_the_reason(
    argv: list[str], reason: str
) -> None:
    with pytest.raises(ValueError, match=reason.replace("(", r"\(")):
        _config(*argv)


def test_a_dram_l1_manager_configures_l1() -> None:
    spec = {
        "type": "DRAM",
        "tag": "_default",
        "size_gb": 0.25,
        "align_bytes": 1024,
        "use_lazy": False,
        "read_ttl_seconds": 7,
        "write_ttl_seconds": 9,
        "eviction": {"eviction_policy": "lru", "trigger_watermark": 0.6, "eviction_ratio": 0.4},
    }
    config = _config("--l1-manager", json.dumps(spec))
    assert config.l1_size_gb == 0.25 and config.eviction_policy == "LRU"
    settings = config.l1_settings()
    assert (settings.align_bytes, settings.use_lazy) == (1024, False)
    assert (settings.read_ttl_seconds, settings.write_ttl_seconds) == (7, 9)
    assert (settings.eviction_trigger_watermark, settings.eviction_ratio) == (0.6, 0.4)


# -- the built server -----------------------------------------------------------------------


@pytest.fixture
def built() -> Iterator[Any]:
    made: list[MPCacheServer] = []

    def build(*argv: str) -> MPCacheServer:
        config = _config("--l1-size-gb", "0.01", "--shm-name", "", "--http-port", "0", *argv)
        made.append(build_cache_server(config))
        return made[-1]

    yield build
    for server in made:
        server.close()


def test_the_built_server_carries_the_flags_into_its_storage(built: Any) -> None:
    server = built(
        "--l1-align-bytes", "16384",
        "--eviction-trigger-watermark", "0.6",
        "--l2-store-policy", "skip_l1",
        "--l2-prefetch-policy", "retain",
    )  # fmt: skip
    l1 = server.storage.local_cpu_backend
    assert l1.l1_settings is not None and l1.l1_settings.eviction_trigger_watermark == 0.6
    assert l1.memory_allocator.align_bytes == 16384
    objs = [l1.allocate(torch.Size([10]), torch.uint8) for _ in range(3)]
    assert all(o is not None and o.metadata.address % 16384 == 0 for o in objs)
    for obj in objs:
        assert obj is not None
        obj.ref_count_down()
    assert server.storage.store_policy == "skip_l1"
    assert server.prefetcher is not None and server.prefetcher.retain


def test_status_reports_how_far_a_lazy_l1_grew_and_its_watermark_evictions(built: Any) -> None:
    server = built("--l1-use-lazy", "--l1-init-size-gb", "0.001")
    alloc = server.storage.local_cpu_backend.memory_allocator
    assert alloc.capacity_bytes == int(0.01 * 1024**3) // 4096 * 4096  # whole blocks
    deadline = time.monotonic() + 10
    while alloc.usable_bytes < alloc.capacity_bytes:  # grows in the background
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (l1,) = [t for t in server.status()["tiers"] if t["kind"] == "l1"]
    assert l1["usable_bytes"] == l1["capacity_bytes"]
    assert l1["watermark_evictions"] == 0


def test_a_prepared_store_is_released_after_the_write_ttl(built: Any) -> None:
    server = built("--l1-write-ttl-seconds", "5", "--pending-transfer-timeout-seconds", "60")
    assert server.settings.prepared_store_ttl_seconds == 5
    l1 = server.storage.local_cpu_backend
    store_obj = l1.allocate(torch.Size([64]), torch.uint8)
    read_obj = l1.allocate(torch.Size([64]), torch.uint8)
    assert store_obj is not None and read_obj is not None
    server._pending.stores[(1, (1,))] = Pending([], [store_obj], [], created=100.0)
    server._pending.retrieves[(1, (2,))] = Pending([], [read_obj], [], created=100.0)
    server.reap(now=104.0)
    assert len(server._pending.stores) == 1  # younger than the write TTL
    server.reap(now=106.0)
    assert not server._pending.stores  # the write lock expired: its L1 memory is back
    assert len(server._pending.retrieves) == 1  # retrieves keep the pending timeout
    assert store_obj.get_ref_count() == 0


# -- the command line ------------------------------------------------------------------------


def _run_module(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LMCACHE_LOG_LEVEL="WARNING")
    return subprocess.run(
        [sys.executable, "-m", "lmcache.v1.multiprocess.server", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize(
    "argv", [["--gds-l1-path", "/nvme"], ["--l1-manager", '{"type":"DEVDAX"}']]
)
def test_refusals_are_one_error_line_never_unrecognized_arguments(argv: list[str]) -> None:
    result = _run_module("--port", str(free_port()), "--http-port", "0", *argv)
    assert result.returncode != 0
    assert "unrecognized arguments" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "error:" in last and "refused" in last


def _get_json(url: str) -> Any:
    """GET ``url`` once the HTTP frontend listens (it may come up after the ZMQ port)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                return json.loads(reply.read())
        except urllib.error.URLError as exc:
            if isinstance(exc, urllib.error.HTTPError) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_upstreams_storage_command_line_starts_a_real_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    http_port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    server = ServerProcess(
        ["--l1-size-gb", "0.0625", "--http-port", str(http_port), *UPSTREAM_STORAGE_LINE], log
    )
    try:
        server.wait_ready()
        mp = _get_json(f"http://127.0.0.1:{http_port}/config")["mp"]
        assert mp["eviction_trigger_watermark"] == 0.9
        assert mp["eviction_ratio"] == 0.1
        assert mp["l2_store_policy"] == "default" and mp["l1_use_lazy"] is True
        refused = urllib.request.Request(
            f"http://127.0.0.1:{http_port}/reconfigure/dax/l2/add", data=b"{}", method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(refused, timeout=10)
        assert answer.value.code == 501
        body = json.loads(answer.value.read())
        assert body["error"] == "not_implemented" and "fixed at start-up" in body["message"]
    finally:
        assert server.stop() == 0, server.log()
