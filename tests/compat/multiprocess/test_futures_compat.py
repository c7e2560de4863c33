"""MessagingFuture / DeviceMessagingFuture / MessagingStream beyond upstream 0.5.6's tests."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from lmcache.compat.upstream_056.futures import (
    DeviceMessagingFuture,
    LMCacheTimeoutError,
    MessagingFuture,
    MessagingStream,
)
from lmcache.v1.platform.base.event_ipc import get_event_ipc_backend


class _RecordingBackend:
    """An event backend whose events complete when the test says so."""

    device_type = "fake"

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.complete = False
        self._lock = threading.Lock()

    def _log(self, *call: Any) -> None:
        with self._lock:
            self.calls.append(call)

    def check_event_support(self, device: object) -> None:
        self._log("check", device)

    def import_event(self, handle: bytes, device: object) -> str:
        self._log("import", handle)
        time.sleep(0.01)  # widen the window for a second importer
        return "EVT"

    def wait_event(self, event: object, stream: object) -> None:
        self._log("wait", event, stream)

    def synchronize_event(self, event: object, device: object) -> None:
        self._log("sync", event)
        self.complete = True

    def query_event(self, event: object) -> bool:
        self._log("query", event)
        return self.complete

    def names(self) -> list[str]:
        return [call[0] for call in self.calls]


def _device_future(
    backend: _RecordingBackend,
) -> tuple[MessagingFuture[tuple[bytes, Any]], DeviceMessagingFuture[Any]]:
    raw: MessagingFuture[tuple[bytes, Any]] = MessagingFuture()
    return raw, raw.to_device_future("dev", event_backend=backend)  # type: ignore[arg-type]


def test_a_future_settles_once() -> None:
    future: MessagingFuture[int] = MessagingFuture()
    future.set_exception(ConnectionError("send failed"))
    future.set_result(1)  # a late reply must not hide the local failure
    with pytest.raises(ConnectionError):
        future.result(timeout=0)
    ok: MessagingFuture[int] = MessagingFuture()
    ok.set_result(1)
    ok.set_exception(RuntimeError("late"))
    assert ok.result(timeout=0) == 1


def test_timeout_error_is_a_builtin_timeout() -> None:
    future: MessagingFuture[int] = MessagingFuture()
    with pytest.raises(TimeoutError) as info:
        future.result(timeout=0.01)
    assert isinstance(info.value, LMCacheTimeoutError)
    assert LMCacheTimeoutError("x", session_id="req-1").session_id == "req-1"


def test_release_references_drops_retained_values() -> None:
    future: MessagingFuture[int] = MessagingFuture()
    value = object()
    future.retain_reference(value)
    assert future._retained_references == [value]
    future.release_references()
    assert future._retained_references == []


def test_device_future_none_result_and_single_sync() -> None:
    backend = _RecordingBackend()
    raw, fut = _device_future(backend)
    assert not fut.query()
    raw.set_result((b"handle", None))
    assert not fut.query()  # the event is still pending
    assert fut.result(timeout=1) is None  # upstream asserted a non-None result here
    assert fut.result(timeout=1) is None and fut.query() and fut.wait(0)
    assert backend.names().count("import") == 1
    assert backend.names().count("sync") == 1  # later waits know the event completed
    assert fut.is_done_.is_set()


def test_device_future_imports_once_under_concurrent_waiters() -> None:
    backend = _RecordingBackend()
    raw, fut = _device_future(backend)
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(fut.result(5))) for _ in range(8)]
    for thread in threads:
        thread.start()
    raw.set_result((b"handle", 3))
    for thread in threads:
        thread.join(5)
    assert results == [3] * 8
    assert backend.names().count("import") == 1


def test_failed_raw_reply_fails_the_device_future_without_device_calls() -> None:
    backend = _RecordingBackend()
    raw, fut = _device_future(backend)
    raw.set_exception(ConnectionResetError("server went away"))
    assert fut.query() is True and fut.wait(0) is True
    with pytest.raises(ConnectionResetError):
        fut.result(timeout=0)
    with pytest.raises(ConnectionResetError):
        fut.wait_on_stream("s", timeout=0)
    assert backend.calls == []


def test_device_future_local_failure_and_set_result_refused() -> None:
    backend = _RecordingBackend()
    _, fut = _device_future(backend)
    fut.set_exception(RuntimeError("cancelled locally"))
    assert fut.query()
    with pytest.raises(RuntimeError, match="cancelled locally"):
        fut.result(timeout=0)  # no wait on the raw reply that will never come
    with pytest.raises(NotImplementedError):
        fut.set_result(1)


def test_wait_on_stream_times_out_on_a_missing_reply() -> None:
    backend = _RecordingBackend()
    _, fut = _device_future(backend)
    with pytest.raises(LMCacheTimeoutError, match="raw result not available"):
        fut.wait_on_stream("s", timeout=0.01)
    assert fut.wait(timeout=0.01) is False


def test_host_backend_round_trip() -> None:
    # A real exported host-event handle, on the CPU backend this package ships.
    backend = get_event_ipc_backend("cpu")
    handle = backend.export_event(backend.create_event("cpu"), "cpu")
    raw: MessagingFuture[tuple[bytes, str]] = MessagingFuture()
    fut = raw.to_device_future("cpu")
    raw.set_result((handle, "done"))
    assert fut.wait_on_stream(None, timeout=1) == "done"
    assert fut.query() and fut.result(timeout=1) == "done"


def test_to_cuda_future_is_deprecated() -> None:
    raw: MessagingFuture[tuple[bytes, int]] = MessagingFuture()
    with pytest.warns(DeprecationWarning, match="to_device_future"):
        raw.to_cuda_future("cpu")


def test_stream_close_wakes_a_blocked_reader_and_runs_callbacks_once() -> None:
    wake = threading.Event()

    def read(closed: threading.Event) -> int:
        wake.wait(5)
        if closed.is_set():
            raise StopIteration
        return 1

    stream: MessagingStream[int] = MessagingStream(read, wake.set)
    ran: list[str] = []
    stream.add_close_callback(lambda: ran.append("cb"))
    items: list[int] = []
    reader = threading.Thread(target=lambda: items.extend(stream))
    reader.start()
    time.sleep(0.05)
    stream.close()
    reader.join(5)
    assert not reader.is_alive() and items == []
    stream.close()
    assert ran == ["cb"] and stream.closed
    stream.add_close_callback(lambda: ran.append("late"))  # runs at once
    assert ran == ["cb", "late"]
    with pytest.raises(StopIteration):
        next(stream)


def _export_cpu_event(handles: Any, release: Any) -> None:
    """Child process: record a host event, export its handle, stay alive until released
    (an exported handle is importable only while its exporter lives)."""
    import torch

    backend = get_event_ipc_backend(torch.device("cpu"))
    event = backend.create_event(torch.device("cpu"))
    backend.record_event(event, None)
    handles.put(backend.export_event(event, torch.device("cpu")))
    release.wait(60)


def test_device_future_imports_an_event_exported_by_another_process() -> None:
    # What upstream's cuda-marked tests do (they are GPU-only there), on the real host
    # event backend across processes.
    import multiprocessing

    import torch

    ctx = multiprocessing.get_context("spawn")
    handles = ctx.Queue()
    release = ctx.Event()
    child = ctx.Process(target=_export_cpu_event, args=(handles, release))
    child.start()
    try:
        handle = handles.get(timeout=60)
        raw: MessagingFuture[tuple[bytes, dict[str, int]]] = MessagingFuture()
        future = DeviceMessagingFuture(raw, device=torch.device("cpu"))
        assert not future.query()
        raw.set_result((handle, {"stored": 2}))
        assert future.result(timeout=5) == {"stored": 2}
        assert future.query()
    finally:
        release.set()
        child.join(timeout=30)
    assert child.exitcode == 0


def test_device_future_with_a_malformed_handle_raises_a_clear_error() -> None:
    import torch

    raw: MessagingFuture[tuple[bytes, int]] = MessagingFuture()
    future = DeviceMessagingFuture(raw, device=torch.device("cpu"))
    raw.set_result((b"not-an-event-handle", 3))
    with pytest.raises(ValueError, match="host event handles are 8 bytes"):
        future.result(timeout=1)
