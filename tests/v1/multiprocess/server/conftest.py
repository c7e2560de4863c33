"""In-process cache servers for the HTTP frontend's tests (no subprocess, no shared memory)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lmcache.v1.multiprocess.server import MPCacheServer, build_cache_server
from lmcache.v1.multiprocess.server_config import MPServerConfig
from lmcache.v1.multiprocess.wire.security import ADMIN_TOKEN_ENV


@pytest.fixture
def make_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., MPCacheServer]]:
    """``make_engine(**MPServerConfig fields)``: a small L1-only server, closed afterwards."""
    monkeypatch.delenv(ADMIN_TOKEN_ENV, raising=False)
    made: list[MPCacheServer] = []

    def make(**overrides: Any) -> MPCacheServer:
        base: dict[str, Any] = {
            "chunk_size": 16,
            "l1_size_gb": 1 / 256,
            "shm_name": "",
            "disable_metrics": True,
            "l2_prefetch_max_in_flight": 0,
        }
        made.append(build_cache_server(MPServerConfig(**(base | overrides))))
        return made[-1]

    yield make
    for engine in made:
        engine.close()
