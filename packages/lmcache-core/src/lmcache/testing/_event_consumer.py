"""The other process of the event-IPC ordering test (``python -m lmcache.testing._event_consumer``).

Reads JSON lines on stdin: first ``{"backend", "device", "wrapper"}`` (it maps the shared
tensor, then answers ``{"ready": true}``), then any number of ``{"event", "wait"}``: it
imports the event, waits on it (``wait`` ``stream``: ``wait_event`` on its current stream;
``host``: ``synchronize_event``), reads the tensor and answers ``{"digest"}`` -- what it
saw, byte for byte.  An empty line (or end of input) ends it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch


def _answer(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def _request() -> dict[str, Any] | None:
    line = sys.stdin.readline().strip()
    if not line:
        return None
    request: dict[str, Any] = json.loads(line)
    return request


def main() -> int:
    from lmcache.testing.devices import digest
    from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
    from lmcache.v1.platform.registry import get_registry

    setup = _request()
    if setup is None:
        return 1
    spec = get_registry().backends[setup["backend"]].spec
    spec.ipc_wrapper_cls  # noqa: B018 - importing it registers its wire tag
    wrapper = DeviceIPCWrapper.Deserialize(bytes.fromhex(setup["wrapper"]))
    mapped = wrapper.to_tensor()
    device = torch.device(setup["device"])
    events = spec.event_ipc_backend
    if events is None:
        raise SystemExit(f"backend {setup['backend']!r} declares no event IPC backend")
    _answer({"ready": True})
    while (request := _request()) is not None:
        event = events.import_event(bytes.fromhex(request["event"]), device)
        if request["wait"] == "stream":
            events.wait_event(event, None)  # the read below is queued after the event
        else:
            events.synchronize_event(event, device)
        _answer({"digest": digest(mapped)})
    wrapper.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
