"""The table of in-flight puts shared by the disk and Redis tiers."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from lmcache.v1.storage_backend.put_tasks import PutTasks, PutTasksFull


def _done(value: object = None) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def test_second_put_of_a_key_in_flight_is_skipped() -> None:
    tasks: PutTasks[str] = PutTasks()
    started: list[list[str]] = []

    def submit(fresh: list[str]) -> Future:
        started.append(fresh)
        return Future()

    first = tasks.start(["a", "b", "a"], submit)
    assert first is not None and started == [["a", "b"]]
    assert tasks.start(["a", "b"], submit) is None  # all in flight: nothing started
    assert tasks.start(["b", "c"], submit) is not None and started[-1] == ["c"]
    assert "a" in tasks and "c" in tasks and len(tasks) == 3
    tasks.finish(["a", "b"])
    assert "a" not in tasks and len(tasks) == 1


def test_a_write_that_finishes_inside_submit_is_forgotten() -> None:
    """``submit`` runs under the table's lock: a write finishing before ``start`` returns
    cannot leave its keys behind as in flight forever."""
    tasks: PutTasks[str] = PutTasks()
    with ThreadPoolExecutor(max_workers=1) as pool:

        def submit(fresh: list[str]) -> Future:
            return pool.submit(tasks.finish, fresh)

        future = tasks.start(["k"], submit)
        assert future is not None
        future.result(timeout=10)
    assert "k" not in tasks and len(tasks) == 0


def test_limit_refuses_at_once_and_starts_nothing() -> None:
    tasks: PutTasks[int] = PutTasks(limit=3)
    assert tasks.start([1, 2], lambda fresh: Future()) is not None
    with pytest.raises(PutTasksFull) as refused:
        tasks.start([3, 4], lambda fresh: pytest.fail("must not start"))
    assert refused.value.keys == 2 and refused.value.limit == 3
    assert len(tasks) == 2 and 3 not in tasks
    assert tasks.start([3], lambda fresh: Future()) is not None
    with pytest.raises(ValueError):
        PutTasks(limit=0)


def test_wait_for_ignores_failed_and_cancelled_puts() -> None:
    tasks: PutTasks[str] = PutTasks()
    failed: Future = Future()
    cancelled: Future = Future()
    pending: Future = Future()
    tasks.start(["f"], lambda fresh: failed)
    tasks.start(["c"], lambda fresh: cancelled)
    tasks.start(["p", "q"], lambda fresh: pending)
    assert tasks.pending(["p", "q", "x"]) == [pending]  # one future per put, not per key
    failed.set_exception(OSError("disk full"))
    cancelled.cancel()
    tasks.wait_for(["f", "c"])  # neither raises: a failed put is a miss
    waiter = threading.Thread(target=tasks.wait_for)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # waits for every put when no keys are given
    pending.set_result(None)
    waiter.join(10)
    assert not waiter.is_alive()


def test_the_disk_tier_waits_on_its_table(tmp_path: Path) -> None:
    """A read of a key whose put is in flight waits for it (through the table)."""
    from conftest import fill_obj, make_config, make_key

    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
    from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

    cpu = LocalCPUBackend(make_config(local_cpu=False))
    config = make_config(local_disk=f"file://{tmp_path}", max_local_disk_size="1MiB")
    disk = LocalDiskBackend(config, cpu)
    gate = threading.Event()
    try:
        assert isinstance(disk._puts, PutTasks) and disk.queues_own_puts
        for _ in range(4):  # holds the tier's four writers up...
            disk._executor.submit(gate.wait, 30)
        obj = fill_obj(cpu, 7)
        disk.batched_submit_put_task([make_key(7)], [obj])
        obj.ref_count_down()
        assert disk.exists_in_put_tasks(make_key(7)) and not disk.contains(make_key(7))
        with ThreadPoolExecutor(max_workers=1) as pool:
            reader = pool.submit(disk.get_blocking, make_key(7))
            assert not reader.done()
            gate.set()  # ...until now: the read waits for the write, then hits
            got = reader.result(timeout=10)
        assert got is not None
        got.ref_count_down()
        assert not disk.exists_in_put_tasks(make_key(7))
    finally:
        gate.set()
        disk.close()
        cpu.close()
