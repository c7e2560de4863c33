"""The circuit breaker alone: it opens on the first failure, lets exactly one half-open
probe through per interval, and closes only when a probe succeeds."""

from __future__ import annotations

import threading
import time

from lmcache.v1.storage_backend.redis.breaker import CircuitBreaker, RedisStats

INTERVAL_S = 0.2


def test_one_half_open_probe_at_a_time() -> None:
    stats = RedisStats()
    breaker = CircuitBreaker(INTERVAL_S, stats, probe_timeout_s=60)
    assert breaker.allow() and breaker.allow()  # closed: every call goes
    breaker.failed(TimeoutError("hung"))
    assert not breaker.is_up and stats.outages == 1
    assert not breaker.allow()  # open: fail fast until the interval is over
    time.sleep(INTERVAL_S * 1.2)
    allowed = []
    threads = [threading.Thread(target=lambda: allowed.append(breaker.allow())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(allowed) == [False] * 7 + [True]  # one probe among 8 callers
    time.sleep(INTERVAL_S * 1.2)
    assert not breaker.allow()  # still one probe in flight, however long it hangs
    breaker.failed(TimeoutError("hung again"))  # the probe failed: reopened...
    assert not breaker.allow()  # ...and the next probe is an interval after the failure
    assert stats.outages == 1  # one outage, however many probes fail
    time.sleep(INTERVAL_S * 1.2)
    assert breaker.allow() and not breaker.allow()
    breaker.succeeded()
    assert breaker.is_up and breaker.allow() and breaker.allow()


def test_a_lost_probe_is_given_up_after_the_probe_timeout() -> None:
    breaker = CircuitBreaker(INTERVAL_S, RedisStats(), probe_timeout_s=0.3)
    breaker.failed(ConnectionError("refused"))
    time.sleep(INTERVAL_S * 1.2)
    assert breaker.allow()  # this probe's caller never reports back
    assert not breaker.allow()
    time.sleep(0.35)
    assert breaker.allow()  # not stuck open forever
