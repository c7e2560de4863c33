"""Stream-ordered recorders: records survive concurrency and each is drained exactly once."""

from __future__ import annotations

import threading
from typing import Any


def test_event_record_fields(ops: Any) -> None:
    ops.drain_recorded_events()
    meta = {"a": "b"}
    ops.record_event_on_stream(0, "store", "session-1", meta, {"n": 3})
    meta["a"] = "changed"
    [(name, session, stamp, str_md, int_md)] = ops.drain_recorded_events()
    assert (name, session, str_md, int_md) == ("store", "session-1", {"a": "b"}, {"n": 3})
    assert isinstance(stamp, float)
    assert ops.drain_recorded_events() == []


def test_completion_record_fields(ops: Any) -> None:
    ops.drain_recorded_completions()
    ops.record_completion_on_stream(0, "retrieve", b"\x01\x02")
    assert ops.drain_recorded_completions() == [("retrieve", b"\x01\x02")]
    assert ops.drain_recorded_completions() == []


def test_concurrent_records_and_drains_lose_and_duplicate_nothing(ops: Any) -> None:
    ops.drain_recorded_completions()
    writers, per_writer = 4, 2000
    drained: list[tuple[str, bytes]] = []
    done = threading.Event()

    def write(w: int) -> None:
        for i in range(per_writer):
            ops.record_completion_on_stream(0, f"w{w}", i.to_bytes(4, "little"))

    def drain() -> None:
        while not done.is_set():
            drained.extend(ops.drain_recorded_completions())

    drainer = threading.Thread(target=drain)
    drainer.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    drainer.join()
    drained.extend(ops.drain_recorded_completions())
    assert len(drained) == writers * per_writer
    assert len(set(drained)) == writers * per_writer
    for w in range(writers):  # each writer's records stay in order
        mine = [int.from_bytes(p, "little") for k, p in drained if k == f"w{w}"]
        assert mine == list(range(per_writer))
