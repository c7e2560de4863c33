"""A long L1 prefault says so: a start line (size, where), progress, and the time taken.

The thresholds are lowered so a small L1 counts as long; below the threshold the same
lines go to DEBUG, so a small server's INFO log stays quiet.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch

from lmcache.v1.multiprocess.server import startup
from lmcache.v1.multiprocess.server.startup import build_cache_server, prefault_buffer
from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.platform.cpu.shm import SHM_DIR

LOGGER = "lmcache.v1.multiprocess.server.startup"
MiB = 1024**2


@pytest.fixture
def long_prefaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(startup, "PREFAULT_LOG_MIN_BYTES", 4 * MiB)
    monkeypatch.setattr(startup, "_PREFAULT_STEP_BYTES", 1 * MiB)
    monkeypatch.setattr(startup, "PREFAULT_PROGRESS_SECONDS", 3600.0)  # quarters only


def _info_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]


def test_long_prefault_logs_start_quarters_and_time(
    long_prefaults: None, caplog: pytest.LogCaptureFixture
) -> None:
    buffer = torch.full((8 * MiB,), 7, dtype=torch.uint8)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        prefault_buffer(buffer, "/dev/shm/lmcache_mp_test")
    lines = _info_lines(caplog)
    assert lines and lines[0] == "prefaulting L1: 0.01 GiB in /dev/shm/lmcache_mp_test", lines
    assert [re.sub(r" \(.*", "", line) for line in lines[1:-1]] == [
        "prefaulting L1: 25%",
        "prefaulting L1: 50%",
        "prefaulting L1: 75%",
    ]
    assert re.fullmatch(r"prefaulted L1 \(0\.01 GiB\) in \d+\.\d s", lines[-1]), lines
    assert int(buffer.count_nonzero()) == 0  # every byte written


def test_slow_prefault_logs_progress_every_interval(
    long_prefaults: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Between quarters a progress line still comes every PREFAULT_PROGRESS_SECONDS."""
    monkeypatch.setattr(startup, "PREFAULT_PROGRESS_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        prefault_buffer(torch.empty(8 * MiB, dtype=torch.uint8), "process memory")
    progress = [line for line in _info_lines(caplog) if "%" in line]
    assert len(progress) == 7  # after each 1 MiB step but the last


def test_short_prefault_stays_out_of_the_info_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(startup, "PREFAULT_LOG_MIN_BYTES", 64 * MiB)
    monkeypatch.setattr(startup, "_PREFAULT_STEP_BYTES", 1 * MiB)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        prefault_buffer(torch.empty(8 * MiB, dtype=torch.uint8), "process memory")
    assert _info_lines(caplog) == []
    assert any("prefaulted L1" in r.getMessage() for r in caplog.records)


def test_server_start_names_the_l1_segment_it_prefaults(
    long_prefaults: None, caplog: pytest.LogCaptureFixture
) -> None:
    config = MPServerConfig(l1_size_gb=8 / 1024, http_port=0, prometheus_port=0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        engine = build_cache_server(config)
    try:
        shm_name = engine.get_stats().shm_name
        assert shm_name
        lines = _info_lines(caplog)
        assert f"prefaulting L1: 0.01 GiB in {SHM_DIR}/{shm_name.lstrip('/')}" in lines
        assert any(line.startswith("prefaulted L1 (0.01 GiB) in ") for line in lines)
    finally:
        engine.close()
