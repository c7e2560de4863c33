"""``migrate_to_shm_and_wrap`` moves a tensor's whole storage into one shared segment.

Upstream 0.5.6's semantics: views of one buffer share one segment at their own offsets,
re-migrating is idempotent, size-1 strides are normalised in place on the caller's
tensor, an empty tensor is wrapped without a segment, and the segment's name goes once
the last tensor in it is freed.
"""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch

from lmcache.v1.platform.base.ipc_wire import CpuShmIPCData
from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
from lmcache.v1.platform.cpu import shm
from lmcache.v1.platform.cpu.shm import (
    CpuShmTensorWrapper,
    migrate_to_shm_and_wrap,
    shm_segment_of,
    unlink_segment,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shm needed")


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join("/dev/shm", name.lstrip("/")))


def test_size_one_strides_are_normalised_on_the_callers_tensor() -> None:
    src = torch.zeros(8 * 32).as_strided((8, 1, 1, 32), (32, 1, 1, 1))
    wrapper = migrate_to_shm_and_wrap(src)
    try:
        assert tuple(src.shape) == (8, 32, 1, 1) and src.is_contiguous()
        assert wrapper.shape == (8, 32, 1, 1)
        assert shm_segment_of(src) == wrapper.shm_name
        src.add_(3.0)
        assert torch.equal(wrapper.to_tensor(), src)
    finally:
        unlink_segment(wrapper.shm_name)


def test_a_plain_contiguous_tensor_keeps_its_shape() -> None:
    src = torch.arange(8 * 32, dtype=torch.float32).reshape(8, 1, 32)
    wrapper = migrate_to_shm_and_wrap(src)
    try:
        assert tuple(src.shape) == (8, 1, 32)
        assert torch.equal(src, torch.arange(8 * 32, dtype=torch.float32).reshape(8, 1, 32))
    finally:
        unlink_segment(wrapper.shm_name)


def test_a_padded_view_keeps_its_strides_and_data() -> None:
    base = torch.arange(40, dtype=torch.float32).reshape(4, 10)
    view = base[:, :8]
    wrapper = migrate_to_shm_and_wrap(view)
    try:
        assert tuple(view.shape) == (4, 8) and tuple(view.stride()) == (10, 1)
        assert wrapper.stride == (10, 1) and wrapper.nbytes == 40 * 4
        assert torch.equal(wrapper.to_tensor(), base[:, :8])
    finally:
        unlink_segment(wrapper.shm_name)


def test_an_empty_tensor_is_wrapped_without_a_segment() -> None:
    src = torch.empty((0, 4), dtype=torch.float16)
    wrapper = migrate_to_shm_and_wrap(src)
    assert wrapper.shm_name == "" and wrapper.nbytes == 0
    again = DeviceIPCWrapper.Deserialize(DeviceIPCWrapper.Serialize(wrapper))
    assert isinstance(again, CpuShmTensorWrapper) and again == wrapper
    rebuilt = again.to_tensor()
    assert rebuilt.shape == (0, 4) and rebuilt.dtype == torch.float16
    assert CpuShmTensorWrapper.wrap(torch.empty(3, 0)).shm_name == ""


def test_only_an_empty_tensor_may_travel_without_a_segment() -> None:
    wrapper = CpuShmTensorWrapper(torch.empty(0, 4), "", 0)
    metadata = wrapper.wire_metadata()
    metadata.shape = (2, 4)
    metadata.stride = (4, 1)
    with pytest.raises(ValueError, match="without a segment"):
        CpuShmTensorWrapper.from_wire(CpuShmIPCData(metadata=metadata, shm_name="", nbytes=0))


def test_views_of_one_storage_share_one_segment_at_their_offsets() -> None:
    base = torch.arange(4 * 64, dtype=torch.float32)
    views = [base[i * 64 : (i + 1) * 64].view(4, 16) for i in range(4)]
    wrappers = [migrate_to_shm_and_wrap(v) for v in views]
    try:
        assert len({w.shm_name for w in wrappers}) == 1
        assert [w.storage_offset for w in wrappers] == [0, 64, 128, 192]
        assert all(w.nbytes == 4 * 64 * 4 for w in wrappers)
        assert len({id(v.untyped_storage()) for v in views}) == 1
        # Every view kept its bytes, including those copied before it was re-pointed.
        assert torch.equal(torch.cat([v.flatten() for v in views]), torch.arange(256.0))
        rebuilt = wrappers[2].to_tensor()
        rebuilt.fill_(-1.0)
        assert views[2].eq(-1.0).all() and not views[1].eq(-1.0).any()
    finally:
        unlink_segment(wrappers[0].shm_name)


def test_a_lone_offset_view_round_trips() -> None:
    base = torch.arange(300, dtype=torch.float32)
    view = base[100:200]
    wrapper = migrate_to_shm_and_wrap(view)
    try:
        assert wrapper.storage_offset == 100 and wrapper.nbytes == 300 * 4
        assert int(view.storage_offset()) == 100
        assert torch.equal(wrapper.to_tensor(), torch.arange(100, 200, dtype=torch.float32))
    finally:
        unlink_segment(wrapper.shm_name)


def test_migration_is_idempotent_across_siblings_and_repeats() -> None:
    base = torch.zeros(128)
    v1, v2 = base[:64], base[64:]
    w1 = migrate_to_shm_and_wrap(v1)
    try:
        storage = v1.untyped_storage()
        assert migrate_to_shm_and_wrap(v2).shm_name == w1.shm_name
        assert migrate_to_shm_and_wrap(v1).shm_name == w1.shm_name
        assert v1.untyped_storage() is storage
    finally:
        unlink_segment(w1.shm_name)


def test_segment_is_unlinked_when_its_last_tensor_is_freed() -> None:
    base = torch.zeros(128)
    v1, v2 = base[:64], base[64:]
    name = migrate_to_shm_and_wrap(v1).shm_name
    migrate_to_shm_and_wrap(v2)
    del base, v1
    gc.collect()
    assert _exists(name)  # v2 still uses the segment
    del v2
    gc.collect()
    assert not _exists(name)


def test_a_sibling_migrated_after_the_segment_died_gets_a_new_one() -> None:
    base = torch.arange(128, dtype=torch.float32)
    v1 = base[:64]
    first = migrate_to_shm_and_wrap(v1).shm_name
    del v1
    gc.collect()
    assert not _exists(first)
    v2 = base[64:]
    wrapper = migrate_to_shm_and_wrap(v2)
    try:
        assert wrapper.shm_name != first and _exists(wrapper.shm_name)
        assert torch.equal(v2, torch.arange(64, 128, dtype=torch.float32))
    finally:
        unlink_segment(wrapper.shm_name)


def test_the_migration_mark_lives_and_dies_with_its_storage() -> None:
    """Siblings find the segment through the original storage itself; once that storage
    is freed nothing of it remains, so a new buffer (whatever its id) gets its own."""
    base = torch.zeros(64)
    view = base[:32]
    wrapper = migrate_to_shm_and_wrap(view)
    try:
        assert shm._migrated_storage(base.untyped_storage()) is view.untyped_storage()
        old_name = wrapper.shm_name
        del base, view
        gc.collect()
        for _ in range(8):  # new buffers, some of which may reuse the freed storage's id
            fresh = torch.arange(64, dtype=torch.float32)
            assert shm._migrated_storage(fresh.untyped_storage()) is None
            other = migrate_to_shm_and_wrap(fresh[:16])
            try:
                assert other.shm_name != old_name
                assert torch.equal(fresh[:16], torch.arange(16, dtype=torch.float32))
            finally:
                unlink_segment(other.shm_name)
    finally:
        unlink_segment(wrapper.shm_name)


def test_to_tensor_mapping_belongs_to_the_returned_tensor() -> None:
    src = torch.zeros(2, 2)
    wrapper = migrate_to_shm_and_wrap(src)
    name = wrapper.shm_name
    view = wrapper.to_tensor()
    ref = weakref.ref(view)
    del view
    gc.collect()
    assert ref() is None  # the wrapper does not hold what it mapped
    kept = wrapper.to_tensor().reshape(4)
    del src
    gc.collect()
    assert not _exists(name)  # the worker's tensor is gone, so the name went with it
    kept.fill_(5.0)  # the mapping itself lives on with the tensor that made it
    assert kept.sum().item() == 20.0
