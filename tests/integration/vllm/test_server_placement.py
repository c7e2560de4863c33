"""``lmcache.mp.server_placement``: choosing prefix or rank placement, a rank's server, and
the scheduler's view of every server (``LinkGroup``), with stand-in links."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lmcache.integration.vllm.mp_config import parse_extra_config
from lmcache.integration.vllm.server_placement import (
    LinkGroup,
    resolve_placement,
    server_of_rank,
)
from lmcache.v1.multiprocess.worker.client import ServerUnavailableError


@pytest.mark.parametrize(
    ("placement", "world", "servers", "expected"),
    [
        ("auto", 2, 2, "rank"),  # what upstream does with this configuration
        ("auto", 4, 2, "rank"),
        ("auto", 1, 2, "prefix"),  # upstream refuses it; prefix placement serves it
        ("auto", 3, 2, "prefix"),
        ("auto", 8, 1, "prefix"),  # one server: the same either way
        ("prefix", 4, 2, "prefix"),
        ("rank", 4, 4, "rank"),
    ],
)
def test_resolve_placement(placement: str, world: int, servers: int, expected: str) -> None:
    assert resolve_placement(placement, world, servers) == expected


def test_rank_placement_needs_a_world_size_multiple_of_the_servers() -> None:
    with pytest.raises(ValueError, match=r"multiple of the 2 servers"):
        resolve_placement("rank", 3, 2)
    with pytest.raises(ValueError, match="server_placement"):
        resolve_placement("round_robin", 2, 2)


def test_ranks_go_to_servers_in_contiguous_blocks() -> None:
    assert [server_of_rank(r, 4, 2) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [server_of_rank(r, 2, 2) for r in range(2)] == [(0, 0), (1, 0)]
    with pytest.raises(ValueError):
        server_of_rank(2, 2, 2)


def test_extra_config_key() -> None:
    assert parse_extra_config({}, env={}).server_placement == "auto"
    config = parse_extra_config({"lmcache.mp.server_placement": "RANK"}, env={})
    assert config.server_placement == "rank"
    with pytest.raises(ValueError, match=r"lmcache\.mp\.server_placement"):
        parse_extra_config({"lmcache.mp.server_placement": "hash"}, env={})


class FakeLink:
    def __init__(self, url: str, answer: int | None, *, down: bool = False) -> None:
        self.url = url
        self.answer = answer
        self.down = down
        self.ready = not down
        self.generation = 1
        self.chunk_size: int | None = 64
        self.block_size = 16
        self.calls: list[str] = []

    def run(self, what: str, call: Callable[[Any], Any]) -> Any:
        self.calls.append(what)
        if self.down:
            raise ServerUnavailableError(f"{self.url} is down")
        return self.answer if what.endswith("prefetch_status") else None


def test_a_group_hits_what_every_server_holds() -> None:
    links = [FakeLink("a", 3), FakeLink("b", 1)]
    group = LinkGroup(links)  # type: ignore[arg-type]
    assert group.run("query_prefetch_status", lambda c: None) == 1
    assert group.run("wait_prefetch_status", lambda c: None) == 1
    assert group.run("lookup", lambda c: None) is None
    assert all(link.calls.count("lookup") == 1 for link in links)  # every server asked
    links[1].answer = None  # still prefetching there
    assert group.run("query_prefetch_status", lambda c: None) is None
    assert (group.url, group.block_size, group.chunk_size) == ("a,b", 16, 64)


def test_a_group_is_down_and_restarted_with_any_of_its_servers() -> None:
    links = [FakeLink("a", 3), FakeLink("b", 3, down=True)]
    group = LinkGroup(links)  # type: ignore[arg-type]
    assert not group.ready
    with pytest.raises(ServerUnavailableError):
        group.run("query_prefetch_status", lambda c: None)
    before = group.generation
    links[1].generation += 1  # the heartbeat met b's new incarnation
    assert group.generation != before
    links[0].chunk_size = None  # not connected yet
    assert group.chunk_size is None
