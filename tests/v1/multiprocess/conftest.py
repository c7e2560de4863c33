"""Fixtures for the MP server suite: real ``lmcache server`` subprocesses on free ports.

Servers bind 127.0.0.1 only and are always stopped (SIGTERM, then SIGKILL) at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from mp_server_helpers import BASE_ARGS, ServerProcess


@pytest.fixture(scope="session")
def server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        log = tmp_path_factory.mktemp("server") / "server.log"
        server = ServerProcess([*BASE_ARGS, *args], log)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def auto_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """Both transfer modes, SHM on (the default)."""
    return server_factory("--supported-transfer-mode", "auto")


@pytest.fixture(scope="session")
def fault_server(server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """Short reap/pending timeouts and a 1 MiB message limit."""
    return server_factory(
        "--supported-transfer-mode",
        "auto",
        "--max-message-mb",
        "1",
        "--worker-reap-timeout-seconds",
        "2",
        "--pending-transfer-timeout-seconds",
        "1",
    )
