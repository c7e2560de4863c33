"""AffinityThreadPool behaviour beyond upstream LMCache 0.5.6's own tests."""

from __future__ import annotations

import threading
from collections.abc import Callable

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


def test_release_idle_keys_keeps_only_keys_with_work_in_flight() -> None:
    # The MP server keys by ZMQ identity; reconnecting clients bring fresh identities, so
    # an idle key must not stay in the table forever.
    pool = AffinityThreadPool(max_workers=2, thread_name_prefix="rel", release_idle_keys=True)
    for i in range(50):
        pool.submit(_thread_name, affinity_key=f"client-{i}".encode()).result(timeout=5)
    assert _settles(lambda: pool.bound_keys == 0)
    pool.shutdown()


def _settles(check: Callable[[], bool]) -> bool:
    """``check`` holds within a second (a key is released by the future's done callback,
    which runs on the worker just after the caller's ``result`` returns)."""
    wait = threading.Event()
    for _ in range(100):
        if check():
            return True
        wait.wait(0.01)
    return check()


def test_release_idle_keys_keeps_order_and_slot_while_work_is_pending() -> None:
    pool = AffinityThreadPool(max_workers=2, thread_name_prefix="ord", release_idle_keys=True)
    gate = threading.Event()
    order: list[int] = []
    first = pool.submit(gate.wait, 5, affinity_key=b"a")
    later = [pool.submit(order.append, i, affinity_key=b"a") for i in range(5)]
    other = pool.submit(_thread_name, affinity_key=b"b").result(timeout=5)
    assert other == "ord-1"  # the least-loaded slot, while "a" holds slot 0
    assert _settles(lambda: pool.bound_keys == 1)  # "b" is idle and released, "a" is not
    assert pool.slot_for(b"a") == 0
    assert pool.slot_for(b"c") == 1  # an idle key is not bound by asking
    assert pool.bound_keys == 1
    gate.set()
    first.result(timeout=5)
    for f in later:
        f.result(timeout=5)
    assert order == [0, 1, 2, 3, 4]
    pool.shutdown()
