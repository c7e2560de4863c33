"""Issue #18 item 3: a cache written through upstream 0.5.6's connector (its MP worker and
scheduler adapters, no vLLM) is read through ours on the same lmcache-core server, and
the reverse: lookups hit and the retrieved blocks hold identical bytes.

Both connectors send token ids; the server names the chunks, so the keys agree whatever
hasher either client would use.  Each direction mixes transfer modes (the writer uses
LMCache-driven, the reader engine-driven), since a stored chunk does not depend on how it
arrived.  Each side rebuilds the same fixed KV pattern, so the reader can compare bytes
without seeing the writer's tensors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RunningServer, run_driver, server_stats
from ours_driver import cross_phase

MODEL = "interop-cross"


def _upstream_phase(python: Path, url: str, mode: str, phase: str, token_base: int) -> dict:
    return run_driver(
        python, "upstream_driver.py", "--url", url, "--mode", mode, "--phase", phase,
        "--model", MODEL, "--token-base", str(token_base),
    )  # fmt: skip


def _assert_hit(result: dict) -> None:
    assert "error" not in result, result.get("traceback", result)
    assert result["lookup_hit_tokens"] == 128, result
    assert result["retrieve_ok"] is True, result
    assert result["bytes_equal"] is True, result


@pytest.mark.parametrize(
    ("writer_mode", "reader_mode"),
    [("lmcache_driven", "engine_driven"), ("engine_driven", "lmcache_driven")],
)
def test_upstream_writes_ours_reads(
    upstream_python: Path, servers: dict[str, RunningServer], writer_mode: str, reader_mode: str
) -> None:
    server = servers["ours"]
    errors_before = server_stats(server.url).errors
    base = 20_000 if writer_mode == "lmcache_driven" else 21_000
    # A miss first: the hit below must come from upstream's store.
    assert (
        cross_phase(server.url, "engine_driven", "load", model=MODEL, token_base=base)[
            "lookup_hit_tokens"
        ]
        == 0
    )
    stored = _upstream_phase(upstream_python, server.url, writer_mode, "store", base)
    assert stored.get("store_ok") is True, stored.get("traceback", stored)
    _assert_hit(cross_phase(server.url, reader_mode, "load", model=MODEL, token_base=base))
    assert server_stats(server.url).errors == errors_before, server.log_tail()


def test_ours_writes_upstream_reads(
    upstream_python: Path, servers: dict[str, RunningServer]
) -> None:
    server = servers["ours"]
    errors_before = server_stats(server.url).errors
    base = 22_000
    stored = cross_phase(server.url, "lmcache_driven", "store", model=MODEL, token_base=base)
    assert stored["store_ok"] is True, stored
    _assert_hit(_upstream_phase(upstream_python, server.url, "engine_driven", "load", base))
    # And a prompt nobody stored misses for upstream's scheduler too.
    missed = _upstream_phase(upstream_python, server.url, "engine_driven", "load", base + 500)
    assert missed.get("lookup_hit_tokens") == 0, missed
    assert server_stats(server.url).errors == errors_before, server.log_tail()
