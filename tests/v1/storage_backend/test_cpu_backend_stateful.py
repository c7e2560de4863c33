"""Stateful model test: the CPU tier against a plain dict, under memory pressure and pins."""

from __future__ import annotations

from collections import Counter

import hypothesis.strategies as st
import torch
from conftest import make_config, make_key
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

KEYS = st.integers(min_value=0, max_value=11)
# Mixed sizes (1, 3 and 4 KiB) in a 16 KiB tier: puts regularly need eviction.
SIZES = st.sampled_from([1024, 3072, 4096])


class CPUBackendMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.backend = LocalCPUBackend(make_config(max_local_cpu_size="16KiB"))
        self.model: dict[int, int] = {}  # key -> fill byte of the stored object
        self.pins: Counter[int] = Counter()
        self.next_value = 1

    def teardown(self) -> None:
        self.backend.close()
        assert self.backend.get_memory_allocator().used_bytes == 0

    def _sync_evictions(self) -> None:
        """Keys the backend dropped must have been unpinned; forget them in the model."""
        for k in list(self.model):
            if not self.backend.contains(make_key(k)):
                assert self.pins[k] == 0, f"pinned key {k} was evicted"
                del self.model[k]

    @rule(k=KEYS, size=SIZES)
    def put(self, k: int, size: int) -> None:
        value = self.next_value % 251
        self.next_value += 1
        already = self.backend.contains(make_key(k))
        obj = self.backend.allocate(torch.Size([size]), torch.uint8, busy_loop=False)
        self._sync_evictions()
        if obj is None:
            # Only legal when every remaining object is pinned.
            assert all(self.pins[k2] > 0 for k2 in self.model)
            return
        obj.tensor.fill_(value)
        self.backend.batched_submit_put_task([make_key(k)], [obj])
        obj.ref_count_down()
        if not already or k not in self.model:
            self.model[k] = value
        assert self.backend.contains(make_key(k))

    @rule(k=KEYS)
    def get(self, k: int) -> None:
        obj = self.backend.get_blocking(make_key(k))
        if obj is None:
            assert k not in self.model
            return
        assert k in self.model
        assert bool((obj.tensor == self.model[k]).all())
        obj.ref_count_down()

    @rule(k=KEYS)
    def pin(self, k: int) -> None:
        ok = self.backend.pin(make_key(k))
        assert ok == (k in self.model)
        if ok:
            self.pins[k] += 1

    @rule(k=KEYS)
    def unpin(self, k: int) -> None:
        ok = self.backend.unpin(make_key(k))
        assert ok == (k in self.model and self.pins[k] > 0)
        if ok:
            self.pins[k] -= 1

    @rule(k=KEYS, force=st.booleans())
    def remove(self, k: int, force: bool) -> None:
        ok = self.backend.remove(make_key(k), force=force)
        expected = k in self.model and (force or self.pins[k] == 0)
        assert ok == expected
        if ok:
            del self.model[k]
            self.pins[k] = 0

    @rule(ks=st.lists(KEYS, max_size=6))
    def batched_contains(self, ks: list[int]) -> None:
        hits = self.backend.batched_contains([make_key(k) for k in ks])
        expected = 0
        for k in ks:
            if k not in self.model:
                break
            expected += 1
        assert hits == expected

    @invariant()
    def bounded_and_consistent(self) -> None:
        assert len(self.backend) == len(self.model)
        allocator = self.backend.get_memory_allocator()
        assert allocator.used_bytes <= allocator.capacity_bytes
        assert allocator.memcheck()
        for k, count in self.pins.items():
            if count:
                assert k in self.model


CPUBackendMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCPUBackendStateful = CPUBackendMachine.TestCase
