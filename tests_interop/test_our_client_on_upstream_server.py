"""Scenario 2: **our** ``KVCacheWorker`` / ``MPClient`` against upstream LMCache 0.5.6's
``lmcache server``."""

from __future__ import annotations

import pytest
from conftest import RunningServer
from ours_driver import store_lookup_retrieve


@pytest.mark.parametrize("mode", ["engine_driven", "lmcache_driven"])
def test_store_lookup_retrieve(servers: dict[str, RunningServer], mode: str) -> None:
    result = store_lookup_retrieve(servers["upstream"].url, mode, model=f"ours-{mode}")
    assert result["server_is_upstream"] is True
    if mode == "engine_driven":
        assert result["sub_path"] == "shm"
    assert result["store_ok"] is True, servers["upstream"].log_tail()
    assert result["lookup_hit_tokens"] == 128
    assert result["miss_hit_tokens"] == 0
    assert result["retrieve_ok"] is True
    assert result["bytes_equal"] is True


def test_our_server_is_not_taken_for_upstream(servers: dict[str, RunningServer]) -> None:
    result = store_lookup_retrieve(servers["ours"].url, "engine_driven", model="ours-self")
    assert result["server_is_upstream"] is False
    assert result["bytes_equal"] is True


def test_upstream_server_without_shm_is_refused_clearly(
    servers: dict[str, RunningServer],
) -> None:
    """Upstream without SHM expects pickled chunks, which we never send."""
    with pytest.raises(ValueError, match="expects pickled chunks"):
        store_lookup_retrieve(servers["upstream_no_shm"].url, "engine_driven", model="ours-pk")
