"""The ``fault_inject`` adapter: another adapter whose loads fail for chosen keys.

For chaos tests and diagnostics (upstream's ``fault_inject`` type).  Every operation goes
to the wrapped (``inner``) adapter; only load results are changed: a dropped key's bit is
cleared, so a key that lookups report present fails to load -- an L2 read error.  Which
keys drop is deterministic: a key hash (seeded) below ``rate``, plus fixed positions of
each load batch (``gap_indices`` from the head, ``gap_tail_ratios`` as a fraction of the
batch from the tail: 0 = last, 1 = first).  JSON::

    {"type": "fault_inject", "inner": {"type": "mock", ...}, "rate": 0.5, "seed": 0,
     "gap_indices": [], "gap_tail_ratios": []}
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import TYPE_CHECKING

from lmcache.v1.storage_backend.l2_adapters.base import (
    AdapterUsage,
    L2AdapterInterface,
    L2TaskId,
)
from lmcache.v1.storage_backend.l2_adapters.config import (
    L2AdapterConfigBase,
    get_l2_adapter_config_class,
    register_l2_adapter_type,
)
from lmcache.v1.storage_backend.l2_adapters.factory import (
    create_l2_adapter_from_registry,
    register_l2_adapter_factory,
)

if TYPE_CHECKING:
    from lmcache.v1.memory.base import MemoryObj
    from lmcache.v1.storage_backend.l2_adapters.bitmap import Bitmap
    from lmcache.v1.storage_backend.l2_adapters.types import (
        L1MemoryDesc,
        L2AdapterListener,
        L2StoreResult,
        MemoryLayoutDesc,
        ObjectKey,
    )

logger = logging.getLogger(__name__)

_HASH_BUCKETS = 1_000_000


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_fraction(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


class FaultInjectL2AdapterConfig(L2AdapterConfigBase):
    """The wrapped adapter's config and the drop rules (see the module doc)."""

    def __init__(
        self,
        inner_config: L2AdapterConfigBase,
        rate: float,
        seed: int,
        gap_indices: tuple[int, ...],
        gap_tail_ratios: tuple[float, ...] = (),
    ) -> None:
        self.inner_config = inner_config
        self.rate = rate
        self.seed = seed
        self.gap_indices = gap_indices
        self.gap_tail_ratios = gap_tail_ratios

    @classmethod
    def from_dict(cls, d: dict) -> FaultInjectL2AdapterConfig:
        inner = d.get("inner")
        if not isinstance(inner, dict):
            raise ValueError("'inner' must be an adapter spec dict with a 'type' field")
        if not isinstance(inner.get("type"), str):
            raise ValueError("'inner' adapter spec must include a string 'type'")
        inner_config = get_l2_adapter_config_class(inner["type"]).from_dict(inner)
        inner_config.eviction_config = cls._parse_eviction_config(inner)
        inner_config.persist_config = cls._parse_persist_config(inner)
        inner_config.serde_config = cls._parse_serde_config(inner)
        rate = d.get("rate", 0.0)
        if not _is_fraction(rate):
            raise ValueError("rate must be a number in [0, 1]")
        seed = d.get("seed", 0)
        if not _is_int(seed):
            raise ValueError("seed must be an integer")
        gaps = d.get("gap_indices", [])
        if not isinstance(gaps, list) or not all(_is_int(i) and i >= 0 for i in gaps):
            raise ValueError("gap_indices must be a list of non-negative integers")
        ratios = d.get("gap_tail_ratios", [])
        if not isinstance(ratios, list) or not all(_is_fraction(x) for x in ratios):
            raise ValueError("gap_tail_ratios must be a list of floats in [0, 1]")
        return cls(
            inner_config=inner_config,
            rate=float(rate),
            seed=seed,
            gap_indices=tuple(gaps),
            gap_tail_ratios=tuple(float(x) for x in ratios),
        )

    @classmethod
    def help(cls) -> str:
        return (
            "Fault-injecting L2 adapter (tests and diagnostics: loads of chosen keys fail). "
            "Fields:\n"
            '- inner (dict, required): the wrapped adapter spec, e.g. {"type": "mock", ...}\n'
            "- rate (float): share of keys whose loads fail, in [0,1] (default 0)\n"
            "- seed (int): seed of the per-key hash (default 0)\n"
            "- gap_indices (list[int]): positions of each load batch that always fail\n"
            "- gap_tail_ratios (list[float]): positions as a fraction of the batch from "
            "its tail (0 = last, 1 = first)"
        )


class FaultInjectL2Adapter(L2AdapterInterface):
    """``inner`` with load failures injected (byte accounting and listeners are inner's)."""

    def __init__(
        self,
        inner: L2AdapterInterface,
        rate: float,
        seed: int,
        gap_indices: tuple[int, ...],
        gap_tail_ratios: tuple[float, ...] = (),
    ) -> None:
        super().__init__(max_capacity_bytes=0)
        self._inner = inner
        self._rate = rate
        self._seed = seed
        self._gap_indices = frozenset(gap_indices)
        self._gap_tail_ratios = tuple(gap_tail_ratios)
        self._load_keys: dict[L2TaskId, list[ObjectKey]] = {}
        self._keys_lock = threading.Lock()
        logger.warning(
            "fault injection ACTIVE on %s: rate=%.3f seed=%d gap_indices=%s "
            "gap_tail_ratios=%s (test and diagnostic use only)",
            type(inner).__name__,
            rate,
            seed,
            sorted(self._gap_indices),
            list(self._gap_tail_ratios),
        )

    def _should_drop_key(self, key: ObjectKey) -> bool:
        """Whether ``key`` falls in the rate's share (a stable hash of its identity
        fields, never its repr, so runs with one seed drop the same keys)."""
        if self._rate <= 0.0:
            return False
        ident = (
            f"{self._seed}:{key.chunk_hash.hex()}:{key.model_name}:"
            f"{key.kv_rank}:{key.object_group_id}:{key.cache_salt}"
        )
        digest = hashlib.blake2b(ident.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % _HASH_BUCKETS < int(self._rate * _HASH_BUCKETS)

    def _drop_positions(self, keys: list[ObjectKey]) -> list[int]:
        """Positions of ``keys`` (one load batch, in order) whose loads fail."""
        n = len(keys)
        from_tail = {round((1.0 - r) * (n - 1)) for r in self._gap_tail_ratios} if n else set()
        return [
            i
            for i, key in enumerate(keys)
            if i in from_tail or i in self._gap_indices or self._should_drop_key(key)
        ]

    def get_store_event_fd(self) -> int:
        return self._inner.get_store_event_fd()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._inner.get_lookup_and_lock_event_fd()

    def get_load_event_fd(self) -> int:
        return self._inner.get_load_event_fd()

    def submit_store_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        return self._inner.submit_store_task(keys, objects)

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        return self._inner.pop_completed_store_tasks()

    def submit_lookup_and_lock_task(
        self, keys: list[ObjectKey], group_layout_descs: dict[int, MemoryLayoutDesc]
    ) -> L2TaskId:
        return self._inner.submit_lookup_and_lock_task(keys, group_layout_descs)

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        return self._inner.query_lookup_and_lock_result(task_id)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        self._inner.submit_unlock(keys)

    def submit_load_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        task_id = self._inner.submit_load_task(keys, objects)
        with self._keys_lock:
            self._load_keys[task_id] = list(keys)
        return task_id

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        """Inner's result with the dropped positions cleared (once per task)."""
        bitmap = self._inner.query_load_result(task_id)
        if bitmap is None:
            return None
        with self._keys_lock:
            keys = self._load_keys.pop(task_id, None)
        if keys is not None:
            dropped = self._drop_positions(keys)
            for i in dropped:
                bitmap.clear(i)
            if dropped:
                logger.debug(
                    "fault injection: task %s dropped %d/%d", task_id, len(dropped), len(keys)
                )
        return bitmap

    def register_listener(self, listener: L2AdapterListener) -> None:
        self._inner.register_listener(listener)

    def set_backend_identity(self, name: str, shared: bool = False) -> None:
        self._inner.set_backend_identity(name, shared)

    def delete(self, keys: list[ObjectKey]) -> None:
        self._inner.delete(keys)

    def get_usage(self) -> AdapterUsage:
        return self._inner.get_usage()

    @property
    def supports_global_eviction(self) -> bool:
        return self._inner.supports_global_eviction

    def report_status(self) -> dict:
        status = self._inner.report_status()
        status["fault_inject"] = {
            "rate": self._rate,
            "seed": self._seed,
            "gap_indices": sorted(self._gap_indices),
            "gap_tail_ratios": list(self._gap_tail_ratios),
        }
        return status

    def close(self) -> None:
        with self._keys_lock:
            self._load_keys.clear()
        self._inner.close()


def _create_fault_inject_adapter(
    config: L2AdapterConfigBase, l1_memory_desc: L1MemoryDesc | None = None
) -> L2AdapterInterface:
    if not isinstance(config, FaultInjectL2AdapterConfig):
        raise TypeError(f"fault_inject needs a FaultInjectL2AdapterConfig, got {type(config)}")
    inner = create_l2_adapter_from_registry(config.inner_config, l1_memory_desc)
    return FaultInjectL2Adapter(
        inner,
        rate=config.rate,
        seed=config.seed,
        gap_indices=config.gap_indices,
        gap_tail_ratios=config.gap_tail_ratios,
    )


register_l2_adapter_type("fault_inject", FaultInjectL2AdapterConfig)
register_l2_adapter_factory("fault_inject", _create_fault_inject_adapter)
