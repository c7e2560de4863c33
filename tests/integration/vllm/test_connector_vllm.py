"""``LMCacheMPConnector`` against vLLM's real classes.

vLLM (~0.7 GB) is installed only in the ``vllm-e2e`` nox session, which runs this file and
sets ``LMCACHE_TEST_REQUIRE_VLLM=1``: there a missing vLLM fails.  The plain ``tests``
sessions and CI's core run have no vLLM by design, so there this module is an explicit
skip -- not a missing-prerequisite failure -- and the connector's vLLM-free logic is still
covered by the other tests in this folder.
"""

from __future__ import annotations

import logging
import socket
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prerequisites import require_module

require_module(
    "vllm",
    "vLLM is installed only in the vllm-e2e nox session (nox -s vllm-e2e)",
    required_env="LMCACHE_TEST_REQUIRE_VLLM",
)

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
    supports_hma,
)

from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector  # noqa: E402

MODULE = "lmcache.integration.vllm.lmcache_mp_connector"


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _transfer_config(port: int, **extra: object) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="LMCacheMPConnector",
        kv_connector_module_path=MODULE,
        kv_role="kv_both",
        kv_connector_extra_config={
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": str(port),
            **extra,
        },
    )


def test_vllm_factory_resolves_our_class() -> None:
    cls = KVConnectorFactory.get_connector_class(_transfer_config(5555))
    assert cls is LMCacheMPConnector
    assert issubclass(cls, KVConnectorBase_V1) and supports_hma(cls)
    assert not getattr(cls, "__abstractmethods__", None)


def _fake_vllm_config(port: int, tp: int = 1, **extra: object) -> SimpleNamespace:
    return SimpleNamespace(
        kv_transfer_config=_transfer_config(port, **extra),
        model_config=SimpleNamespace(model="m", served_model_name="m"),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1),
        cache_config=SimpleNamespace(block_size=32),
    )


def test_server_down_at_start_leaves_the_cache_off_with_a_hint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = _unused_port()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="lmcache.integration.vllm"):
        connector = LMCacheMPConnector(
            _fake_vllm_config(port, **{"lmcache.mp.mq_timeout": "2"}),
            KVConnectorRole.SCHEDULER,
            None,
        )
    try:
        assert time.monotonic() - started < 30
        assert connector.health.is_down and connector.chunk_size is None
        assert f"--port {port}" in caplog.text
        request = SimpleNamespace(request_id="r", prompt_token_ids=list(range(64)))
        assert connector.get_num_new_matched_tokens(request, 0) == (0, False)
    finally:
        connector.shutdown()


def test_bad_extra_config_fails_before_connecting() -> None:
    with pytest.raises(ValueError, match=r"lmcache\.mp\.port"):
        LMCacheMPConnector(
            _fake_vllm_config(5555, **{"lmcache.mp.port": "x"}), KVConnectorRole.WORKER, None
        )


def test_autostart_starts_one_server_for_both_roles_and_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its lock and log files
    port = _unused_port()
    extra = {
        "lmcache.mp.autostart": "true",
        "lmcache.mp.autostart.server_args": "--l1-size-gb 0.05",
    }
    worker = LMCacheMPConnector(_fake_vllm_config(port, **extra), KVConnectorRole.WORKER, None)
    scheduler = LMCacheMPConnector(
        _fake_vllm_config(port, **extra), KVConnectorRole.SCHEDULER, None
    )
    owned = worker._autostarted
    try:
        assert owned is not None and owned.running
        assert scheduler._autostarted is None  # it found the worker's server answering
        assert worker.chunk_size is not None and scheduler.chunk_size == worker.chunk_size
    finally:
        scheduler.shutdown()
        worker.shutdown()
    assert owned is not None and not owned.running


# Needs vLLM: the vllm-e2e nox session runs exactly these files (-m vllm).
pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("placement", ["auto", "rank"])
def test_rank_placement_wires_each_role_as_upstream(
    small_server: Any, monkeypatch: pytest.MonkeyPatch, placement: str
) -> None:
    """TP=2 over two servers: the scheduler asks both (one side, world size 1 each); the
    worker of rank 1 connects to the second server only, as rank 0 of its one worker."""
    from lmcache.integration.vllm import lmcache_mp_connector
    from lmcache.integration.vllm.server_placement import LinkGroup

    urls = [small_server(), small_server()]
    config = _fake_vllm_config(
        5555,  # the port is ignored: server_urls wins
        tp=2,
        **{"lmcache.mp.server_urls": ",".join(urls), "lmcache.mp.server_placement": placement},
    )
    scheduler = LMCacheMPConnector(config, KVConnectorRole.SCHEDULER, None)
    monkeypatch.setattr(lmcache_mp_connector, "tp_rank", lambda: 1)
    worker = LMCacheMPConnector(config, KVConnectorRole.WORKER, None)
    try:
        assert scheduler.placement == worker.placement == "rank"
        [side] = scheduler._scheduler.sides
        assert isinstance(side.link, LinkGroup) and side.world_size == 1
        assert [link.url for link in side.link.links] == urls
        assert [link.url for link in worker.links] == [urls[1]]
        [worker_side] = worker._worker.sides
        assert (worker_side.world_size, worker_side._fixed_rank) == (1, 0)
    finally:
        scheduler.shutdown()
        worker.shutdown()


def test_prefix_placement_keeps_every_server_on_every_side(small_server: Any) -> None:
    urls = [small_server(), small_server()]
    config = _fake_vllm_config(
        5555, tp=2, **{"lmcache.mp.server_urls": urls, "lmcache.mp.server_placement": "prefix"}
    )
    worker = LMCacheMPConnector(config, KVConnectorRole.WORKER, None)
    try:
        assert worker.placement == "prefix"
        assert [side.link.url for side in worker._worker.sides] == urls
        assert all(side.world_size == 2 for side in worker._worker.sides)
    finally:
        worker.shutdown()


def test_reset_cache_clears_every_server_or_says_why_not(
    small_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM's reset_prefix_cache(reset_connector=True) lands here: ``clear`` on every
    server, an admin operation each server must allow."""
    open_url, closed_url = small_server("--enable-admin-ops"), small_server()
    allowed = _fake_vllm_config(5555, **{"lmcache.mp.server_urls": open_url})
    both = _fake_vllm_config(5555, **{"lmcache.mp.server_urls": [open_url, closed_url]})
    scheduler = LMCacheMPConnector(allowed, KVConnectorRole.SCHEDULER, None)
    mixed = LMCacheMPConnector(both, KVConnectorRole.SCHEDULER, None)
    worker = LMCacheMPConnector(allowed, KVConnectorRole.WORKER, None)
    try:
        assert scheduler.reset_cache() is True
        with caplog.at_level(logging.WARNING, logger="lmcache.integration.vllm"):
            assert mixed.reset_cache() is False
        assert closed_url in caplog.text and "--enable-admin-ops" in caplog.text
        assert open_url not in caplog.text  # that one cleared
        assert worker.reset_cache() is None
    finally:
        for connector in (scheduler, mixed, worker):
            connector.shutdown()
