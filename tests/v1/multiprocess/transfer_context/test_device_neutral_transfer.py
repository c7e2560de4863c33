"""The server's LMCache-driven path is device-neutral.

* A worker whose device cannot do LMCache-driven transfer gets the typed
  ``unsupported_transfer_mode`` reply at registration, whatever capability is missing.
* ``hostsim`` (``tests/plugins/hostsim``, a real installed backend wheel over host memory
  with its own DeviceSpec, IPC wrapper, cache context and event IPC) runs the full round
  trip through a real ``lmcache server``: the server maps its wrappers with the hostsim
  context, copies with that context's ``transfer_blocks`` and waits with the hostsim event
  backend (whose handles the cpu backend would refuse), bit-exact.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from mp_server_helpers import BASE_ARGS, ServerProcess

import lmcache.v1.platform
from lmcache.v1.multiprocess.server import build_cache_server
from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.multiprocess.wire.protocol import ErrorCode, ProtocolError
from lmcache.v1.platform.base.cache_context import BaseCacheContext
from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
from lmcache.v1.platform.cpu.event_ipc import HostEventIPCBackend

# -- typed refusal, in process ------------------------------------------------------------


class _Wrapper(DeviceIPCWrapper):
    device_type: ClassVar[str] = "nodrive"
    closed = 0

    def to_tensor(self) -> torch.Tensor:
        return torch.zeros(2, 4, 4, 1, 8)

    def close(self) -> None:
        type(self).closed += 1


class _Context(BaseCacheContext):
    device_type: ClassVar[str] = "nodrive"
    closed = 0

    @property
    def layout(self) -> Any:
        raise AssertionError("a refused worker's layout must not be read")

    def get_shape_desc(self, group_idx: int = 0) -> Any:
        raise AssertionError("unreachable")

    def transfer_blocks(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("unreachable")

    def cache_size_per_token(self) -> int:
        return 0

    def close(self) -> None:
        type(self).closed += 1


class _Events(HostEventIPCBackend):
    def check_event_support(self, device: Any) -> None:
        raise RuntimeError("no interprocess events on this device")


class _Spec(DeviceSpec):
    """A ``nodrive`` backend; ``missing`` names the one capability it lacks."""

    def __init__(self, missing: str) -> None:
        super().__init__()
        self.missing = missing

    @property
    def device_type(self) -> str:
        return "nodrive"

    def is_available(self) -> bool:
        return self.missing != "available"

    @property
    def ipc_wrapper_cls(self) -> Any:
        return None if self.missing == "wrapper" else _Wrapper

    def is_handle_transfer_available(self) -> bool:
        return self.missing != "handles"

    @property
    def event_ipc_backend(self) -> Any:
        if self.missing == "events":
            return None
        return _Events() if self.missing == "event_support" else HostEventIPCBackend()

    def create_cache_context(self, *args: Any, **kwargs: Any) -> BaseCacheContext:
        if self.missing == "context":
            return super().create_cache_context(*args, **kwargs)  # NotImplementedError
        return _Context(kv_caches=[torch.zeros(1)], device="nodrive:0", num_layers=1)


@pytest.fixture
def specs(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, DeviceSpec]]:
    table: dict[str, DeviceSpec] = {}
    monkeypatch.setattr(lmcache.v1.platform, "get_device_spec", table.get)
    yield table


@pytest.fixture
def server(specs: dict[str, DeviceSpec]) -> Iterator[Any]:
    config = MPServerConfig(chunk_size=16, l1_size_gb=0.01, shm_name="", disable_metrics=True)
    engine = build_cache_server(config)
    yield engine
    engine.close()


@pytest.mark.parametrize(
    ("missing", "reason"),
    [
        ("spec", "no DeviceSpec is registered"),
        ("available", "not available in this process"),
        ("wrapper", "ipc_wrapper_cls is None"),
        ("handles", r"is_handle_transfer_available\(\) returned False"),
        ("events", "event_ipc_backend is None"),
        ("context", r"does not implement create_cache_context\(\)"),
        ("event_support", "no interprocess events on this device"),
    ],
)
def test_incapable_device_gets_typed_refusal(
    server: Any, specs: dict[str, DeviceSpec], missing: str, reason: str
) -> None:
    if missing != "spec":
        specs["nodrive"] = _Spec(missing)
    _Wrapper.closed = _Context.closed = 0
    with pytest.raises(ProtocolError) as info:
        server.register_kv_cache(7, [_Wrapper(None, torch.float32, (), ())] * 2, "m", 1)
    assert info.value.code is ErrorCode.UNSUPPORTED_TRANSFER_MODE
    assert "'nodrive'" in info.value.message
    assert re.search(reason, info.value.message), info.value.message
    # Nothing stays mapped: the wrappers (or the context that owns them) are closed.
    assert _Wrapper.closed == 2 or _Context.closed == 1
    assert server.worker_counts()["lmcache_driven"] == 0


# -- the hostsim backend, through a real server -------------------------------------------

HOSTSIM_DIST = "lmcache-testplugin-hostsim"


def _hostsim_installed() -> bool:
    try:
        importlib.metadata.distribution(HOSTSIM_DIST)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture
def hostsim() -> None:
    if _hostsim_installed():
        return
    message = f"{HOSTSIM_DIST} is not installed (nox installs tests/plugins/*)"
    if os.environ.get("CI") or os.environ.get("LMCACHE_TEST_REQUIRE_INSTALLED") == "1":
        pytest.fail(message)
    pytest.skip(message)


_WORKER = """
import json, os, torch
from lmcache.v1.multiprocess.worker.kv_cache_worker import KVCacheWorker
from lmcache.v1.platform.cpu.shm import empty_shm_tensor

shape = (2, 48, 4, 2, 8)
gen = torch.Generator().manual_seed(int(os.environ["HOSTSIM_SEED"]))
kv = []
for _ in range(3):
    layer = empty_shm_tensor(shape, torch.bfloat16)
    layer.copy_(torch.randn(shape, generator=gen).to(torch.bfloat16))
    kv.append(layer)
tokens = list(range(1000, 1040))  # 2 full chunks of 16 tokens + 8, 10 blocks of 4
out = {}
try:
    with KVCacheWorker(kv, model_name="hostsim-demo", server_url=os.environ["HOSTSIM_URL"],
                       mode="lmcache_driven", heartbeat_interval=0) as worker:
        out["device_type"] = worker.context.device_type
        out["wrappers"] = sorted({type(w).__name__ for w in worker.context._wrappers})
        source = [layer[:, 0:10].clone() for layer in kv]
        out["stored"] = worker.store(tokens, list(range(10)))
        out["hit"] = worker.lookup(tokens)
        for layer in kv:
            layer[:, 20:30].zero_()
        before = [layer.clone() for layer in kv]
        out["retrieved"] = worker.retrieve(tokens, list(range(20, 30)))
        out["bit_exact"] = all(torch.equal(l[:, 20:30], s) for l, s in zip(kv, source))
        out["others_untouched"] = all(
            torch.equal(l[:, :20], b[:, :20]) and torch.equal(l[:, 30:], b[:, 30:])
            for l, b in zip(kv, before)
        )
except Exception as exc:
    out["error_code"] = getattr(exc, "code", type(exc).__name__)
    out["error"] = str(exc)
print(json.dumps(out))
"""


def _start_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, available: bool
) -> tuple[ServerProcess, Path]:
    trace = tmp_path / "hostsim-trace.jsonl"
    trace.touch()
    # The server keeps its own default selection (cpu); it serves hostsim workers only
    # through the registry, by the device type their wrappers declare.
    monkeypatch.setenv("LMCACHE_DEVICE_BACKEND", "cpu")
    monkeypatch.setenv("LMCACHE_TEST_HOSTSIM_TRACE", str(trace))
    if available:
        monkeypatch.setenv("LMCACHE_TEST_HOSTSIM_AVAILABLE", "1")
    else:
        monkeypatch.delenv("LMCACHE_TEST_HOSTSIM_AVAILABLE", raising=False)
    server = ServerProcess(
        [*BASE_ARGS, "--supported-transfer-mode", "lmcache_driven"], tmp_path / "server.log"
    )
    server.wait_ready()
    return server, trace


def _run_worker(run_python_json: Callable[..., Any], server: ServerProcess, trace: Path) -> Any:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"hostsim round-trip seed: {seed}")
    env = {
        "HOSTSIM_URL": server.url,
        "HOSTSIM_SEED": str(seed),
        "LMCACHE_TEST_HOSTSIM_AVAILABLE": "1",
        "LMCACHE_DEVICE_BACKEND": "hostsim",
        "LMCACHE_TEST_HOSTSIM_TRACE": str(trace),
    }
    return run_python_json(_WORKER, env)


@pytest.mark.plugin_wheels
def test_hostsim_round_trip_runs_through_its_cache_context(
    hostsim: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_python_json: Callable[..., Any],
) -> None:
    server, trace = _start_server(tmp_path, monkeypatch, available=True)
    try:
        result = _run_worker(run_python_json, server, trace)
        status_log = server.log()
    finally:
        server.stop()
    assert "error" not in result, f"{result}\n{status_log}"
    assert result["device_type"] == "hostsim"
    assert result["wrappers"] == ["HostSimShmWrapper"]
    assert result["stored"] is True
    assert result["hit"] == 40
    assert result["retrieved"] is True
    assert result["bit_exact"] is True
    assert result["others_untouched"] is True
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines, "the hostsim backend was never used by the server"
    assert {line["pid"] for line in lines} == {server.proc.pid}
    transfers = [line for line in lines if line["action"] == "transfer_blocks"]
    assert [(t["direction"], t["objects"], t["blocks"]) for t in transfers] == [
        ("D2H", 3, 10),
        ("H2D", 3, 10),
    ]
    # Each copy followed the worker's event, imported through the hostsim backend, and the
    # server waited for each copy's event with that backend.
    assert all(isinstance(t["waited_on"], int) and t["waited_on"] > 0 for t in transfers)
    assert sum(line["action"] == "synchronize" for line in lines) == len(transfers)


@pytest.mark.plugin_wheels
def test_hostsim_worker_refused_where_the_backend_is_unavailable(
    hostsim: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_python_json: Callable[..., Any],
) -> None:
    server, trace = _start_server(tmp_path, monkeypatch, available=False)
    try:
        result = _run_worker(run_python_json, server, trace)
    finally:
        server.stop()
    assert result["error_code"] == ErrorCode.UNSUPPORTED_TRANSFER_MODE.value, result
    assert "'hostsim'" in result["error"] and "not available" in result["error"]
    assert trace.read_text() == ""
