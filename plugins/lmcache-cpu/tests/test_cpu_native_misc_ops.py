"""memcpy, batched_memcpy, calculate_cdf, plan types and the error contract."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_layouts import Geometry, build_cache, random_factory, shape_desc

from lmcache.v1.platform import torch_ops
from lmcache.v1.platform.ops_types import TransferDirection

H2D, D2H = TransferDirection.H2D, TransferDirection.D2H


@pytest.mark.parametrize("mode", ["pointers", "tensors", "mixed"])
@pytest.mark.parametrize("nbytes", [0, 1, 7, 4096, 3 << 20])
def test_lmcache_memcpy_async_is_complete_on_return(
    native_ops: ModuleType, mode: str, nbytes: int
) -> None:
    src = torch.randint(0, 256, (nbytes + 16,), dtype=torch.uint8)
    dst = torch.zeros(nbytes + 16, dtype=torch.uint8)
    src_arg = src.data_ptr() if mode == "pointers" else src
    dst_arg = dst if mode != "pointers" else dst.data_ptr()
    native_ops.lmcache_memcpy_async(dst_arg, src_arg, nbytes, D2H, 0, 0)
    assert torch.equal(dst[:nbytes], src[:nbytes])
    assert not dst[nbytes:].any()


def test_lmcache_memcpy_async_is_positional_only(native_ops: ModuleType) -> None:
    with pytest.raises(TypeError):
        native_ops.lmcache_memcpy_async(dest=0, src=0, nbytes=0, direction=H2D,
                                        host_buffer_offset=0, host_buffer_alignments=0)  # fmt: skip


def test_lmcache_memcpy_async_rejects_non_contiguous_naming_the_argument(
    native_ops: ModuleType,
) -> None:
    src = torch.zeros(8, 8, dtype=torch.float32).t()
    with pytest.raises(ValueError, match="src"):
        native_ops.lmcache_memcpy_async(torch.zeros(64), src, 16, H2D, 0, 0)
    with pytest.raises(ValueError, match="holds"):
        native_ops.lmcache_memcpy_async(torch.zeros(2), torch.zeros(64), 16, H2D, 0, 0)


def test_batched_memcpy(native_ops: ModuleType) -> None:
    srcs = [torch.randint(0, 256, (n,), dtype=torch.uint8) for n in (0, 1, 100, 2 << 20)]
    dsts = [torch.zeros_like(s) for s in srcs]
    native_ops.batched_memcpy(
        [s.data_ptr() for s in srcs], [d.data_ptr() for d in dsts], [s.numel() for s in srcs]
    )
    assert all(torch.equal(s, d) for s, d in zip(srcs, dsts))
    # Overlapping source and destination behave like memmove (as the baseline's ctypes copy).
    buf = torch.arange(64, dtype=torch.uint8)
    expected = buf.clone()
    expected[8:56] = buf[0:48].clone()
    native_ops.batched_memcpy([buf.data_ptr()], [buf.data_ptr() + 8], [48])
    assert torch.equal(buf, expected)
    with pytest.raises(ValueError, match="equal lengths"):
        native_ops.batched_memcpy([1], [], [])
    with pytest.raises(ValueError, match="negative"):
        native_ops.batched_memcpy([srcs[1].data_ptr()] * 2, [dsts[1].data_ptr()] * 2, [1, -1])


@settings(max_examples=80, deadline=None)
@given(
    layers=st.integers(1, 3),
    tokens=st.integers(0, 50),
    channels=st.integers(0, 5),
    num_bins=st.sampled_from([1, 2, 16, 32, 100]),
    dtype=st.sampled_from([torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_calculate_cdf_matches_baseline(
    native_ops: ModuleType,
    layers: int,
    tokens: int,
    channels: int,
    num_bins: int,
    dtype: torch.dtype,
    transposed: bool,
    seed: int,
) -> None:
    high = min(num_bins, 127)
    gen = torch.Generator().manual_seed(seed)
    symbols = torch.randint(0, high, (layers, tokens, channels), generator=gen).to(dtype)
    if transposed:  # strided input
        symbols = symbols.transpose(1, 2).contiguous().transpose(1, 2)
    assert torch.equal(
        native_ops.calculate_cdf(symbols, num_bins), torch_ops.calculate_cdf(symbols, num_bins)
    )


def test_calculate_cdf_validation(native_ops: ModuleType) -> None:
    with pytest.raises(ValueError, match="symbols"):
        native_ops.calculate_cdf(torch.full((1, 2, 2), 5, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="nlayers"):
        native_ops.calculate_cdf(torch.zeros(2, 2, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="num_bins"):
        native_ops.calculate_cdf(torch.zeros(1, 2, 2, dtype=torch.int32), 0)


def test_native_plan_types(native_ops: ModuleType) -> None:
    copy = native_ops.StagingCopy(1, 2, 3, 4)
    assert (copy.dest, copy.src, copy.nbytes, copy.host_offset) == (1, 2, 3, 4)
    launch = native_ops.LaunchVar(0, 16, 8, 2, 1)
    step = native_ops.BatchStep([copy], [launch])
    assert step.staging[0].nbytes == 3 and step.launches[0].total_blocks == 8
    desc = shape_desc(1, Geometry(1, 1, 1, 1, 1), torch.uint8)
    spec = native_ops.KernelGroupSpec(0, [5, 6], desc, 256, 1, 0, 64)
    assert spec.lmcache_objects_ptrs == [5, 6] and spec.shape_desc.bs == 1


# -- error contract -----------------------------------------------------------------------


def _nhd_case() -> tuple[list[torch.Tensor], Geometry]:
    g = Geometry(nl=2, nb=4, bs=4, nh=2, hs=8)
    return build_cache(1, g, random_factory(torch.float16, 0)), g


@pytest.mark.parametrize("direction", [H2D, D2H])
@pytest.mark.parametrize("bad_id", [4, 1000])
def test_out_of_range_block_id_raises_index_error_and_writes_nothing(
    native_ops: ModuleType, direction: TransferDirection, bad_id: int
) -> None:
    cache, g = _nhd_case()
    objects = [random_factory(torch.float16, 1)(g.object_shape(1, 16))]
    before_cache = [t.clone() for t in cache]
    before_objects = [o.clone() for o in objects]
    with pytest.raises(IndexError, match="out of range"):
        native_ops.multi_layer_block_kv_transfer(
            cache, objects, [0, 1, 2, bad_id], "cpu", direction,
            shape_desc(1, g, torch.float16), 16, 1, 0,
        )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(cache, before_cache))
    assert all(torch.equal(a, b) for a, b in zip(objects, before_objects))


@pytest.mark.parametrize("direction", [H2D, D2H])
def test_out_of_range_slot_raises_index_error_and_writes_nothing(
    native_ops: ModuleType, direction: TransferDirection
) -> None:
    cache, g = _nhd_case()
    key_value = random_factory(torch.float16, 2)((2, g.nl, 4, g.nh * g.hs))
    before_cache, before_kv = [t.clone() for t in cache], key_value.clone()
    with pytest.raises(IndexError):
        native_ops.multi_layer_kv_transfer(
            key_value, cache, torch.tensor([0, 1, 2, 16]), "cpu", 0, direction, 1
        )
    with pytest.raises(IndexError):  # also beyond page_buffer_size
        native_ops.multi_layer_kv_transfer(
            key_value, cache, torch.tensor([0, 1, 2, 9]), "cpu", 8, direction, 1
        )
    assert all(torch.equal(a, b) for a, b in zip(cache, before_cache))
    assert torch.equal(key_value, before_kv)


def test_index_error_is_also_the_baselines_value_error(native_ops: ModuleType) -> None:
    cache, g = _nhd_case()
    objects = [torch.zeros(g.object_shape(1, 16), dtype=torch.float16)]
    with pytest.raises(ValueError):
        native_ops.multi_layer_block_kv_transfer(
            cache, objects, [9], "cpu", D2H, shape_desc(1, g, torch.float16), 16, 1, 0
        )


def test_non_contiguous_object_names_the_argument(native_ops: ModuleType) -> None:
    cache, g = _nhd_case()
    good = torch.zeros(g.object_shape(1, 16), dtype=torch.float16)
    strided = torch.zeros(2, g.nl, g.nh * g.hs, 16, dtype=torch.float16).transpose(2, 3)
    with pytest.raises(ValueError, match=r"lmcache_objects_ptrs\[1\]"):
        native_ops.multi_layer_block_kv_transfer(
            cache, [good, strided], [0, 1, 2, 3, 1], "cpu", D2H,
            shape_desc(1, g, torch.float16), 16, 1, 0,
        )  # fmt: skip


def test_non_contiguous_engine_head_names_the_argument(native_ops: ModuleType) -> None:
    g = Geometry(nl=2, nb=4, bs=4, nh=2, hs=8)
    base = torch.zeros(2, g.nb, g.bs, g.hs, g.nh, dtype=torch.float16)
    cache = [base.transpose(-1, -2), base.transpose(-1, -2)]  # HS stride != 1
    objects = [torch.zeros(g.object_shape(1, 16), dtype=torch.float16)]
    with pytest.raises(ValueError, match=r"paged_buffer_ptrs_tensor\[0\]"):
        native_ops.multi_layer_block_kv_transfer(
            cache, objects, [0], "cpu", D2H, shape_desc(1, g, torch.float16), 16, 1, 0
        )


def test_non_contiguous_key_value_names_the_argument(native_ops: ModuleType) -> None:
    cache, g = _nhd_case()
    key_value = torch.zeros(2, g.nl, g.nh * g.hs, 4, dtype=torch.float16).transpose(2, 3)
    with pytest.raises(ValueError, match="key_value"):
        native_ops.multi_layer_kv_transfer(
            key_value, cache, torch.tensor([0, 1, 2, 3]), "cpu", 16, D2H, 1
        )


def test_baseline_validation_errors_are_kept(native_ops: ModuleType) -> None:
    cache, g = _nhd_case()
    objects = [torch.zeros(g.object_shape(1, 16), dtype=torch.float16)]
    desc = shape_desc(1, g, torch.float16)
    with pytest.raises(ValueError, match="lmcache_chunk_size must be positive"):
        native_ops.multi_layer_block_kv_transfer(cache, objects, [0], "cpu", D2H, desc, 0, 1, 0)
    with pytest.raises(ValueError, match="positive multiple"):
        native_ops.multi_layer_block_kv_transfer(cache, objects, [0], "cpu", D2H, desc, 6, 1, 0)
    with pytest.raises(ValueError, match="need 2 LMCache objects"):
        native_ops.multi_layer_block_kv_transfer(
            cache, objects, [0, 1, 2, 3, 0], "cpu", D2H, desc, 16, 1, 0
        )
    with pytest.raises(ValueError, match="direction"):
        native_ops.multi_layer_block_kv_transfer(cache, objects, [0], "cpu", 7, desc, 16, 1, 0)
    with pytest.raises(ValueError, match="unsupported engine_kv_format"):
        native_ops.multi_layer_block_kv_transfer(cache, objects, [0], "cpu", D2H, desc, 16, 99, 0)


def test_thread_count_env_and_default(run_python: object) -> None:
    code = """
        from lmcache_cpu import _native
        print(_native.num_threads(), _native.physical_cores())
    """
    proc = run_python(code, {"LMCACHE_CPU_THREADS": "3"})  # type: ignore[operator]
    assert proc.returncode == 0, proc.stderr
    threads, cores = map(int, proc.stdout.split())
    assert threads == 3
    proc = run_python(code)  # type: ignore[operator]
    threads, cores = map(int, proc.stdout.split())
    assert threads == cores >= 1
