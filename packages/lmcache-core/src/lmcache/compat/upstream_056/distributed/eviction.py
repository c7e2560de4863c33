"""Upstream's ``lmcache.v1.distributed.eviction``: its eviction-policy interface.

Upstream's MP storage manager asks a policy for *actions* (a fraction of the tracked
keys, a destination) and learns of keys through ``on_keys_*`` events; our tiers ask a
:class:`~lmcache.v1.storage_backend.cache_policy.BaseCachePolicy` for victims in order.
The policies themselves are the product's; :mod:`.eviction_policy` wraps each in this
interface, and :class:`L1EvictionPolicy` / :class:`L2EvictionPolicy` turn upstream's
L1-manager and L2-adapter listener events into those ``on_keys_*`` calls.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any


class EvictionDestination(enum.Enum):
    """Where evicted objects go."""

    DISCARD = enum.auto()
    L2_CACHE = enum.auto()


@dataclass(frozen=True)
class EvictionAction:
    """Keys to evict and where they go."""

    destination: EvictionDestination
    keys: list[Any] = field(default_factory=list)


class EvictionPolicy(abc.ABC):
    """Upstream's policy interface (events in, actions out)."""

    @property
    def support_isolation(self) -> bool:
        """Whether :meth:`get_eviction_actions` can be scoped to one ``cache_salt``."""
        return False

    @property
    def name(self) -> str:
        """The policy's section name in a saved checkpoint."""
        return "eviction_policy"

    def capture(self) -> Mapping[str, object]:
        """State a checkpoint must keep (none by default)."""
        return {}

    def restore(self, state: Mapping[str, object]) -> None:
        """Load a :meth:`capture` value (nothing by default)."""
        return None

    @abc.abstractmethod
    def register_eviction_destination(self, destination: EvictionDestination) -> None: ...

    @abc.abstractmethod
    def on_keys_created(self, keys: list[Any]) -> None: ...

    def on_keys_reserved(self, keys: list[Any]) -> None:
        """Keys reserved for a write; by default the same as created."""
        self.on_keys_created(keys)

    @abc.abstractmethod
    def on_keys_touched(self, keys: list[Any]) -> None: ...

    @abc.abstractmethod
    def on_keys_removed(self, keys: list[Any]) -> None: ...

    @abc.abstractmethod
    def get_eviction_actions(
        self,
        expected_ratio: float,
        key_eligible_filter: Callable[[Hashable], bool] | None = None,
        cache_salt: str | None = None,
    ) -> list[EvictionAction]: ...


class L1EvictionPolicy:
    """Feeds upstream's L1-manager events to a policy."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self._policy = policy

    @property
    def policy(self) -> EvictionPolicy:
        return self._policy

    def on_l1_keys_reserved_read(self, keys: list[Any]) -> None:
        return None

    def on_l1_keys_read_finished(self, keys: list[Any]) -> None:
        return None  # releasing a read says nothing about reuse; touches do

    def on_l1_keys_reserved_write(self, keys: list[Any]) -> None:
        self._policy.on_keys_reserved(keys)

    def on_l1_keys_write_finished(self, keys: list[Any]) -> None:
        self._policy.on_keys_created(keys)

    def on_l1_keys_deleted_by_manager(self, keys: list[Any]) -> None:
        self._policy.on_keys_removed(keys)

    def on_l1_keys_finish_write_and_reserve_read(self, keys: list[Any]) -> None:
        self._policy.on_keys_created(keys)

    def on_l1_keys_accessed(self, keys: list[Any]) -> None:
        self._policy.on_keys_touched(keys)


class L2EvictionPolicy:
    """Feeds upstream's L2-adapter listener events to a policy."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self._policy = policy

    @property
    def policy(self) -> EvictionPolicy:
        return self._policy

    def on_l2_keys_stored(self, keys: list[Any], sizes: list[int] | None = None) -> None:
        self._policy.on_keys_created(keys)

    def on_l2_keys_accessed(self, keys: list[Any]) -> None:
        self._policy.on_keys_touched(keys)

    def on_l2_keys_deleted(self, keys: list[Any]) -> None:
        self._policy.on_keys_removed(keys)


__all__ = [
    "EvictionAction",
    "EvictionDestination",
    "EvictionPolicy",
    "L1EvictionPolicy",
    "L2EvictionPolicy",
]
