"""The rate-limited logs of :mod:`lmcache.logging` (shared by the storage tiers and the
server): one line per kind per interval, the count left out carried by the next line."""

from __future__ import annotations

import logging
import time

import pytest

from lmcache.logging import RateLimitedErrorLog, RateLimitedLog

LOGGER = "lmcache.tests.rate_limited"


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_one_line_per_kind_per_interval_then_the_count(caplog: pytest.LogCaptureFixture) -> None:
    limited = RateLimitedLog(logging.getLogger(LOGGER), interval_s=0.2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        logged = [limited.log(logging.WARNING, "enospc", "write failed: %s", i) for i in range(50)]
        assert limited.log(logging.WARNING, "eio", "other kind")  # kinds are apart
        time.sleep(0.25)
        assert limited.log(logging.WARNING, "enospc", "write failed: %s", "late")
    assert logged == [True] + [False] * 49
    assert _messages(caplog) == [
        "write failed: 0",
        "other kind",
        "write failed: late (49 more like it in the last 0s not logged)",
    ]


def test_kinds_are_capped(caplog: pytest.LogCaptureFixture) -> None:
    limited = RateLimitedLog(logging.getLogger(LOGGER), interval_s=3600, max_kinds=3)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for i in range(1000):
            limited.log(logging.WARNING, f"kind-{i}", "event %s", i)
    # Three kinds of their own, then everything else shares one: four lines, not 1000.
    assert _messages(caplog) == ["event 0", "event 1", "event 2", "event 3"]
    assert len(limited._kinds) == 4


def test_error_log_keeps_one_traceback_per_kind(caplog: pytest.LogCaptureFixture) -> None:
    errors = RateLimitedErrorLog(logging.getLogger(LOGGER), interval_s=0.2)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for _ in range(20):
            errors.exception("handler", ValueError("bad"))
        time.sleep(0.25)
        errors.exception("handler", ValueError("bad"))
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.exc_info is not None for r in records] == [True, False]
    assert "19 more like it" in records[1].getMessage()


def test_the_server_still_exports_the_error_log() -> None:
    from lmcache.v1.multiprocess.server import RateLimitedErrorLog as from_server
    from lmcache.v1.multiprocess.server.rate_limited_logs import RateLimitedErrorLog as old_path

    assert from_server is RateLimitedErrorLog and old_path is RateLimitedErrorLog
