"""Event IPC ordering, for backends that declare an ``EventIPCBackend``.

The contract LMCache-driven transfer relies on: work queued on a stream, then an event
recorded after it, exported, imported by another process and waited on there (on that
process's stream, or on its host) orders the other process's reads after the work.  A
host-memory backend's events may be completed markers (host copies are synchronous); the
round trip must still hold.  On devices with a timed sleep kernel the work is provably
still pending at the hand-over, so a backend whose wait does not order fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import torch

from lmcache.testing.devices import (
    delay_current_stream,
    digest,
    pattern,
    release,
    shareable_zeros,
)
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper

SHAPE = (2, 5, 4, 8)
# query_event must answer at once, even while the recorded work is still running.
QUERY_LIMIT_S = 0.5
CONSUMER_TIMEOUT_S = 180


@pytest.fixture
def events(available_spec: Any) -> Any:
    backend = available_spec.event_ipc_backend
    if backend is None:
        pytest.skip(
            f"backend {available_spec.backend_name!r} declares no event IPC "
            "(DeviceSpec.event_ipc_backend is None): LMCache-driven transfer is not offered"
        )
    return backend


@pytest.fixture
def shared(device: str) -> Iterator[torch.Tensor]:
    tensor = shareable_zeros(SHAPE, torch.float16, device)
    try:
        yield tensor
    finally:
        release([tensor])


def _record_after_work(spec: Any, events: Any, tensor: torch.Tensor, device: str) -> Any:
    """Queue (slow work, then) the write of a pattern on the current stream; record after."""
    event = events.create_event(tensor.device)
    pending = delay_current_stream(spec, device)
    tensor.copy_(pattern(tuple(tensor.shape), tensor.dtype, device, seed=3))
    events.record_event(event, None)
    started = time.monotonic()
    complete = events.query_event(event)
    assert time.monotonic() - started < QUERY_LIMIT_S, "query_event blocked"
    if pending:
        assert complete is False, "the sleep kernel queued before the event already finished"
    return event


def test_check_event_support_accepts_the_backend_device(events: Any, device: str) -> None:
    events.check_event_support(torch.device(device))


def test_recorded_event_exports_and_completes_after_the_work(
    available_spec: Any, events: Any, shared: torch.Tensor, device: str
) -> None:
    # Imported only by another process: CUDA-style handles cannot be opened where created.
    event = _record_after_work(available_spec, events, shared, device)
    handle = events.export_event(event, shared.device)
    assert isinstance(handle, bytes)
    events.synchronize_event(event, shared.device)
    assert events.query_event(event) is True
    expected = pattern(SHAPE, torch.float16, device, seed=3)
    assert digest(shared) == digest(expected)


def _send(pipe: IO[str] | None, payload: dict[str, Any]) -> None:
    assert pipe is not None
    pipe.write((json.dumps(payload) if payload else "") + "\n")
    pipe.flush()


def _receive(proc: subprocess.Popen[str], stderr: Path) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(CONSUMER_TIMEOUT_S)
        output = stderr.read_text(errors="replace")[-3000:]
        pytest.fail(f"the consumer process exited ({proc.returncode}):\n{output}")
    answer: dict[str, Any] = json.loads(line)
    return answer


def test_other_process_waiting_on_the_event_sees_the_work(
    available_spec: Any, events: Any, shared: torch.Tensor, device: str, tmp_path: Path
) -> None:
    wrapper_cls = available_spec.ipc_wrapper_cls
    if wrapper_cls is None:
        pytest.skip(
            f"backend {available_spec.backend_name!r} declares no IPC wrapper: no memory "
            "can be shared for its events to order"
        )
    blob = DeviceIPCWrapper.Serialize(wrapper_cls.wrap(shared))
    stderr = tmp_path / "consumer.stderr"
    with stderr.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmcache.testing._event_consumer"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sink, text=True,
        )  # fmt: skip
    expected = digest(pattern(SHAPE, torch.float16, device, seed=3))
    seen: dict[str, str] = {}
    try:
        setup = {"backend": available_spec.backend_name, "device": str(shared.device)}
        _send(proc.stdin, {**setup, "wrapper": blob.hex()})
        assert _receive(proc, stderr) == {"ready": True}
        for wait in ("stream", "host"):  # a device wait, then a host wait
            shared.zero_()
            digest(shared)  # the zeros are in place before the hand-over
            # The consumer has the memory mapped and waits for the handle: work starts now.
            event = _record_after_work(available_spec, events, shared, device)
            handle = events.export_event(event, shared.device)
            _send(proc.stdin, {"event": handle.hex(), "wait": wait})
            seen[wait] = _receive(proc, stderr)["digest"]
        _send(proc.stdin, {})
        assert proc.wait(CONSUMER_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert seen == {"stream": expected, "host": expected}, (
        "the other process read the memory before the work the event was recorded after"
    )
