"""Redis Cluster: a batch is split by the node that owns each key's slot, and each node
has its own circuit breaker, so one dead or hung shard is not a dead tier."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from lmcache.v1.storage_backend.redis.breaker import CircuitBreaker
from lmcache.v1.storage_backend.redis.connection import RedisConnections, unreachable_errors

logger = logging.getLogger(__name__)

UNREACHED = object()
"""A put's answer for a key whose cluster shard could not be reached."""


class ShardedConnections(RedisConnections):
    """:class:`RedisConnections` plus per-shard dispatch (used when ``settings.cluster``)."""

    _shard_breakers: dict[str, CircuitBreaker]

    def health_degraded(self) -> list[str]:
        """The tier's breaker, then each cluster shard whose own breaker is open."""
        reasons = super().health_degraded()
        with self._client_lock:
            shards = sorted((n, b) for n, b in self._shard_breakers.items() if not b.is_up)
        reasons += [
            f"redis cluster shard {node} unreachable: its keys miss and their puts are dropped"
            for node, _ in shards
        ]
        return reasons

    def _shard_breaker(self, node: str) -> CircuitBreaker:
        with self._client_lock:
            breaker = self._shard_breakers.get(node)
            if breaker is None:
                breaker = CircuitBreaker(
                    self.settings.retry_interval_s,
                    self.stats,
                    f"shard {node}",
                    self.settings.probe_timeout_s,
                )
                self._shard_breakers[node] = breaker
            return breaker

    @staticmethod
    def _shards(client: Any, names: list[str]) -> dict[str, list[int]]:
        """Indices of ``names`` grouped by the cluster node that owns their slot."""
        groups: dict[str, list[int]] = {}
        for index, name in enumerate(names):
            node = client.nodes_manager.get_node_from_slot(client.keyslot(name))
            groups.setdefault(node.name, []).append(index)
        return groups

    def _run_sharded(
        self,
        names: list[str],
        op: Callable[[Any, list[int]], list[Any]],
        what: str,
        unreached: Any = None,
    ) -> list[Any] | None:
        """Cluster mode: ``op(client, indices)`` once per shard.  A shard that cannot be
        reached answers ``unreached`` for its keys and is skipped until its own next probe;
        the other shards keep answering (one dead or hung node is not a dead tier)."""
        import redis

        if self._closed or not self._availability.allow():
            return None
        try:
            client = self._get_client()
            shards = self._shards(client, names)
        except unreachable_errors() as exc:
            self._on_connection_error(exc)
            return None
        except redis.RedisError as exc:
            self._on_redis_error(exc, what)
            return None
        self._availability.succeeded()
        answers: list[Any] = [unreached] * len(names)
        for node, indices in shards.items():
            breaker = self._shard_breaker(node)
            if not breaker.allow():
                continue
            try:
                results = op(client, indices)
            except unreachable_errors() as exc:
                self.stats.add(errors=1)
                breaker.failed(exc)
                continue
            except redis.RedisError as exc:
                self.stats.add(errors=1)
                breaker.answered(exc)
                self._error_log.log(
                    logging.WARNING,
                    f"{what} on {node}: {type(exc).__name__}",
                    "redis %s on shard %s failed: %s",
                    what,
                    node,
                    exc,
                )
                continue
            breaker.succeeded()
            for index, result in zip(indices, results):
                answers[index] = result
        return answers
