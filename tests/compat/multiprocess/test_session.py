"""Our ``lmcache.v1.multiprocess.session`` (upstream 0.5.6's API): edge cases upstream's
test_session.py does not cover.  Hashes with sha256_cbor so blake3 is not needed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from lmcache.compat.upstream_056.periodic_thread import PeriodicThreadRegistry
from lmcache.compat.upstream_056.session import Session, SessionManager
from lmcache.compat.upstream_056.token_hasher import TokenHasher

CHUNK = 4


@pytest.fixture
def hasher() -> TokenHasher:
    return TokenHasher(chunk_size=CHUNK, hash_algorithm="sha256_cbor")


@pytest.fixture
def session(hasher: TokenHasher) -> Session:
    return Session(request_id="r", hasher=hasher)


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    PeriodicThreadRegistry.reset()
    yield
    PeriodicThreadRegistry.reset()


def test_changed_tokens_drop_the_stale_hashes(hasher: TokenHasher, session: Session) -> None:
    session.set_tokens(list(range(12)))
    session.get_hashes(0, 12)
    changed = [0, 1, 2, 3, 4, 5, 99, 7, 8, 9, 10, 11]
    session.set_tokens(changed)
    # Chunk 0 is unchanged and kept; chunk 1 changed, so it and all later ones are rehashed.
    assert session.num_chunks_processed == 1
    assert session.get_hashes(0) == hasher.compute_chunk_hashes(changed)


def test_appended_tokens_keep_every_computed_hash(session: Session) -> None:
    session.set_tokens(list(range(8)))
    first = session.get_hashes(0)
    session.set_tokens(list(range(14)))
    assert session.num_chunks_processed == 2
    assert session.get_hashes(0)[:2] == first


def test_shorter_tokens_forget_the_chunks_past_them(hasher: TokenHasher, session: Session) -> None:
    session.set_tokens(list(range(12)))
    session.get_hashes(0)
    session.set_tokens(list(range(6)))
    assert session.num_chunks_processed == 1
    assert session.get_hashes(0) == hasher.compute_chunk_hashes(list(range(6)))
    session.set_tokens([])
    assert session.num_chunks_processed == 0 and session.last_prefix_hash is None


def test_set_tokens_copies_the_list(session: Session) -> None:
    tokens = list(range(8))
    session.set_tokens(tokens)
    tokens.append(8)
    assert session.token_ids == list(range(8))


@pytest.mark.parametrize(("start", "end"), [(1, 8), (0, 6), (-4, 8), (0, -4), (0, 12)])
def test_bad_bounds_raise(session: Session, start: int, end: int) -> None:
    session.set_tokens(list(range(8)))
    with pytest.raises(ValueError):
        session.get_hashes(start, end)
    assert session.num_chunks_processed == 0


def test_start_past_end_is_empty(session: Session) -> None:
    session.set_tokens(list(range(8)))
    assert session.get_hashes(8, 4) == []
    assert session.get_hashes(8) == []


def test_destroy_listeners_run_for_remove_and_expiry(hasher: TokenHasher) -> None:
    manager = SessionManager(hasher, ttl=0.05, cleanup_interval=None)
    seen: list[str] = []

    def broken(_session: Session) -> None:
        raise RuntimeError("listener bug")

    manager.destroy_listeners += [broken, lambda s: seen.append(s.request_id)]
    manager.get_or_create("a")
    manager.get_or_create("b")
    assert manager.remove("a") is not None
    assert manager.remove("a") is None
    time.sleep(0.08)
    assert manager.cleanup_expired() == 1
    assert seen == ["a", "b"]
    assert manager.get("b") is None


def test_get_never_creates(hasher: TokenHasher) -> None:
    manager = SessionManager(hasher, cleanup_interval=None)
    assert manager.get("x") is None and manager.active_count() == 0
    created = manager.get_or_create("x")
    assert manager.get("x") is created


def test_no_cleanup_thread_without_an_interval(hasher: TokenHasher) -> None:
    SessionManager(hasher, cleanup_interval=None).close()
    SessionManager(hasher, cleanup_interval=0).close()
    assert PeriodicThreadRegistry.get_instance().get_all() == []


def test_two_managers_have_their_own_cleanup_threads(hasher: TokenHasher) -> None:
    first = SessionManager(hasher, cleanup_interval=30.0)
    second = SessionManager(hasher, cleanup_interval=30.0)
    registry = PeriodicThreadRegistry.get_instance()
    try:
        assert len(registry.get_all()) == 2
        first.close()
        first.close()
        [left] = registry.get_all()
        assert left.is_running and "cleanup" in left.name
    finally:
        second.close()
    assert registry.get_all() == []
