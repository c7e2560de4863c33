"""Policy interface: the policy only orders keys; the tier decides what may be evicted."""

from __future__ import annotations

import abc
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class BaseCachePolicy(abc.ABC, Generic[K]):
    """Tracks the keys of one tier and yields them in eviction order.

    Not thread-safe: the owning tier calls it under its own lock.  The tier skips
    candidates it cannot evict (pinned, in use), which is why the policy yields an
    iterator instead of a single victim.

    ``evicts`` is False for a policy that never gives up keys (``noop``): a full tier
    with it refuses new data at once instead of waiting for room.
    """

    evicts: bool = True

    @abc.abstractmethod
    def on_put(self, key: K) -> None:
        """``key`` was inserted."""

    @abc.abstractmethod
    def on_hit(self, key: K) -> None:
        """``key`` was read."""

    @abc.abstractmethod
    def on_remove(self, key: K) -> None:
        """``key`` left the tier (evicted or removed); unknown keys are ignored."""

    def on_evict(self, key: K) -> None:
        """``key`` was dropped to make room (a victim of :meth:`candidates`).

        Policies that learn from their own evictions (ARC's ghost lists) tell this apart
        from an explicit removal; the others treat both alike.
        """
        self.on_remove(key)

    @abc.abstractmethod
    def candidates(self) -> Iterator[K]:
        """Keys, best eviction victim first.

        Lazy (no copy of the key set): collect victims first, then call :meth:`on_remove`;
        changing the policy while iterating is an error.
        """

    def ahead_of_need_candidates(self) -> Iterator[K]:
        """Victims for eviction ahead of need (L1's watermark), best first.

        The same as :meth:`candidates` unless a policy must not give up some keys merely to
        keep headroom: ``IsolatedLRU`` offers only over-quota tenants' keys here, so a
        tenant within its quota loses chunks only when a put really needs the room.
        """
        return self.candidates()

    @abc.abstractmethod
    def __len__(self) -> int: ...
