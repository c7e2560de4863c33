"""Process-wide IPC policy: which kind of device-memory handle a worker exports.

Upstream 0.5.6 keeps two switches here that vendor specs read when they pick their IPC
wrapper: ``isolated_ipc`` (handles that survive separate process namespaces, e.g. raw CUDA
IPC handles and timeline-semaphore events) and ``use_vmm_api`` (engine KV allocated with
CUDA VMM).  lmcache-core's own CPU backend ignores both; plugins (lmcache-cuda) may read
them.  There is exactly one policy object per process (``current_ipc_policy``); every
setter updates it in place and returns it, so callers can chain.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = [
    "IPCPolicy",
    "current_ipc_policy",
    "get_ipc_policy",
    "is_isolated_ipc",
    "is_use_vmm_api",
    "set_ipc_policy",
    "set_isolated_ipc",
    "set_use_vmm_api",
]

_lock = threading.Lock()


@dataclass
class IPCPolicy:
    """The two IPC switches; mutated in place so every holder sees the update."""

    isolated_ipc: bool = False
    use_vmm_api: bool = False

    def set(
        self, *, isolated_ipc: bool | None = None, use_vmm_api: bool | None = None
    ) -> IPCPolicy:
        """Update the given switches (``None`` keeps the current value); returns ``self``."""
        with _lock:
            if isolated_ipc is not None:
                self.isolated_ipc = _as_bool("isolated_ipc", isolated_ipc)
            if use_vmm_api is not None:
                self.use_vmm_api = _as_bool("use_vmm_api", use_vmm_api)
        return self

    def with_isolated_ipc(self, enabled: bool = True) -> IPCPolicy:
        return self.set(isolated_ipc=enabled)

    def with_use_vmm_api(self, enabled: bool = True) -> IPCPolicy:
        return self.set(use_vmm_api=enabled)


def _as_bool(name: str, value: object) -> bool:
    # A config string such as "false" must not silently turn a switch on.
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}: {value!r}")
    return value


current_ipc_policy = IPCPolicy()


def get_ipc_policy() -> IPCPolicy:
    return current_ipc_policy


def set_ipc_policy(
    *, isolated_ipc: bool | None = None, use_vmm_api: bool | None = None
) -> IPCPolicy:
    return current_ipc_policy.set(isolated_ipc=isolated_ipc, use_vmm_api=use_vmm_api)


def set_isolated_ipc(enabled: bool) -> IPCPolicy:
    return current_ipc_policy.set(isolated_ipc=enabled)


def is_isolated_ipc() -> bool:
    return current_ipc_policy.isolated_ipc


def set_use_vmm_api(enabled: bool) -> IPCPolicy:
    return current_ipc_policy.set(use_vmm_api=enabled)


def is_use_vmm_api() -> bool:
    return current_ipc_policy.use_vmm_api
