"""AffinityThreadPool behaviour beyond upstream LMCache 0.5.6's own tests."""

from __future__ import annotations

import threading

import pytest

from lmcache.v1.multiprocess.affinity_pool import AffinityThreadPool


def _thread_name() -> str:
    return threading.current_thread().name


def test_submit_after_shutdown_raises_like_an_executor() -> None:
    pool = AffinityThreadPool(max_workers=1)
    pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(_thread_name)
    pool.shutdown()  # a second shutdown is harmless


def test_tasks_queued_before_shutdown_still_run() -> None:
    pool = AffinityThreadPool(max_workers=1)
    gate = threading.Event()
    first = pool.submit(gate.wait, 5)
    queued = [pool.submit(lambda i=i: i) for i in range(3)]
    pool.shutdown(wait=False)
    gate.set()
    assert first.result(timeout=5) is True
    assert [f.result(timeout=5) for f in queued] == [0, 1, 2]


def test_cancelled_queued_task_is_skipped() -> None:
    pool = AffinityThreadPool(max_workers=1)
    gate = threading.Event()
    ran: list[str] = []
    blocker = pool.submit(gate.wait, 5)
    victim = pool.submit(ran.append, "victim")
    after = pool.submit(ran.append, "after")
    assert victim.cancel()
    gate.set()
    blocker.result(timeout=5)
    after.result(timeout=5)
    assert ran == ["after"]
    pool.shutdown()


def test_hashable_keys_and_keyword_arguments() -> None:
    # The MP server keys by ZMQ identity (bytes), not by rank.
    pool = AffinityThreadPool(max_workers=2, thread_name_prefix="ids")
    a = pool.submit(_thread_name, affinity_key=b"client-a").result(timeout=5)
    b = pool.submit(_thread_name, affinity_key=b"client-b").result(timeout=5)
    assert {a, b} == {"ids-0", "ids-1"}
    assert pool.slot_for(b"client-a") == 0 and pool.slot_for(b"client-b") == 1
    assert pool.submit(dict, x=1, affinity_key=b"client-a").result(timeout=5) == {"x": 1}
    pool.shutdown()


def test_shutdown_from_inside_a_task_does_not_deadlock() -> None:
    pool = AffinityThreadPool(max_workers=2)
    pool.submit(pool.shutdown, True).result(timeout=5)
    with pytest.raises(RuntimeError):
        pool.submit(_thread_name)


def test_base_exception_reaches_the_future_and_the_worker_survives() -> None:
    pool = AffinityThreadPool(max_workers=1)

    def interrupt() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pool.submit(interrupt).result(timeout=5)
    assert pool.submit(lambda: 7).result(timeout=5) == 7
    pool.shutdown()


def test_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        AffinityThreadPool(max_workers=0)
