"""Each serde on its own: round trips over dtypes and shapes (odd, empty), the lossy
serdes within their stated error bounds, the lossless one bit-exact, and every way a
stored chunk can be wrong (another serde, none, altered, another key) refused."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prerequisites import require_module

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory.base import MemoryObj
from lmcache.v1.memory.format import MemoryFormat
from lmcache.v1.memory.objects import TensorMemoryObj
from lmcache.v1.storage_backend.cache_salt import configs_with_salt
from lmcache.v1.storage_backend.chunk_format import allocate_for_read
from lmcache.v1.storage_backend.serde import SerdeConfig, SerdeError, build_chunk_serde
from lmcache.v1.storage_backend.serde.chunk_serde import ChunkSerde

require_module(
    "cryptography", "the aesgcm serde needs cryptography (pip install 'lmcache-core[encryption]')"
)

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# |x - x'| <= REL * |x| + ABS within the fp8 range (see the fp8 module).
FP8_BOUNDS = {"float8_e4m3fn": (2.0**-4, 2.0**-10), "float8_e5m2": (2.0**-3, 2.0**-17)}
# Rounding the fp32 dequantised value to the chunk's dtype adds this relative error.
DTYPE_REL = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
# ... and, in the dtype's subnormal range, half its smallest step.
DTYPE_ABS = {torch.float16: 2.0**-25, torch.bfloat16: 2.0**-134, torch.float32: 2.0**-150}

MASTER = os.urandom(32)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _master_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMC_TEST_SERDE_KEY", MASTER.hex())


def aes(**extra: object) -> dict[str, object]:
    return {"type": "aesgcm", "master_key_env": "LMC_TEST_SERDE_KEY", **extra}


def serde(spec: dict[str, object]) -> ChunkSerde:
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    return build_chunk_serde(SerdeConfig(str(spec["type"]), kwargs))


def key(salt: str = "", chunk: int = 7) -> CacheEngineKey:
    return CacheEngineKey("m", 1, 0, chunk, torch.half, configs_with_salt(None, salt))


def chunk(t: torch.Tensor, fmt: MemoryFormat = MemoryFormat.KV_2LTD) -> MemoryObj:
    return TensorMemoryObj.from_tensor(t, fmt)


def decode(s: ChunkSerde, k: CacheEngineKey, blob: bytes) -> torch.Tensor:
    obj = s.decode(k, blob, lambda sh, dt, fmt: allocate_for_read(None, sh, dt, fmt))
    assert obj is not None
    assert obj.tensor is not None
    return obj.tensor


shapes = st.lists(st.integers(0, 9), min_size=1, max_size=4).map(tuple)
kv_shapes = st.tuples(st.integers(0, 3), st.integers(0, 11), st.integers(1, 9)).map(
    lambda s: (2, *s)
)


def random_tensor(
    shape: tuple[int, ...], dtype: torch.dtype, seed: int, scale: float
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


@SETTINGS
@given(
    shape=shapes,
    dtype=st.sampled_from(FLOAT_DTYPES),
    fp8=st.sampled_from(sorted(FP8_BOUNDS)),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-3, 0.1, 1.0, 30.0]),
)
def test_fp8_round_trip_within_bound(
    shape: tuple[int, ...], dtype: torch.dtype, fp8: str, seed: int, scale: float
) -> None:
    x = random_tensor(shape, dtype, seed, scale)
    s = serde({"type": "fp8", "fp8_dtype": fp8})
    blob = s.encode(key(), chunk(x))
    back = decode(s, key(), blob)
    assert back.dtype == dtype and back.shape == x.shape
    rel, abs_ = FP8_BOUNDS[fp8]
    err = (back.float() - x.float()).abs()
    assert bool((err <= rel * x.float().abs() + abs_).all())
    # One byte per element: the stored body is half of a 16-bit chunk.
    assert s.encoded_size(chunk(x)) == x.numel()


@pytest.mark.parametrize("fp8", sorted(FP8_BOUNDS))
def test_fp8_saturates_instead_of_nan(fp8: str) -> None:
    limit = torch.finfo(getattr(torch, fp8)).max
    x = torch.tensor([[1e9, -1e9, float("inf"), 3.0]], dtype=torch.float32)
    s = serde({"type": "fp8", "fp8_dtype": fp8})
    back = decode(s, key(), s.encode(key(), chunk(x, MemoryFormat.UNDEFINED)))
    assert back.tolist()[0][:3] == [limit, -limit, limit]


@pytest.mark.parametrize("fp8", sorted(FP8_BOUNDS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_lookup_tables_equal_torchs_cast_for_every_value(fp8: str, dtype: torch.dtype) -> None:
    from lmcache.v1.storage_backend.serde.fp8 import dequantize, quantize

    fp8_dtype = getattr(torch, fp8)
    every = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)
    limit = torch.finfo(fp8_dtype).max
    expected = every.clamp(-limit, limit).to(fp8_dtype)
    got = quantize(every, fp8_dtype)
    assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
    bytes_ = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(fp8_dtype)
    for out in (torch.float16, torch.bfloat16, torch.float32):
        a, b = dequantize(bytes_, out), bytes_.to(out)
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])


def test_fp8_refuses_integer_kv() -> None:
    s = serde({"type": "fp8"})
    with pytest.raises(SerdeError, match="floating-point"):
        s.encode(key(), chunk(torch.zeros(4, dtype=torch.int8)))


@SETTINGS
@given(
    shape=kv_shapes,
    dtype=st.sampled_from([torch.float16, torch.bfloat16]),
    fp8=st.sampled_from(sorted(FP8_BOUNDS)),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([1e-4, 1.0, 1e3]),
)
def test_asym_k16_v8_keys_exact_values_within_bound(
    shape: tuple[int, ...], dtype: torch.dtype, fp8: str, seed: int, scale: float
) -> None:
    x = random_tensor(shape, dtype, seed, scale)
    s = serde({"type": "asym_k16_v8", "fp8_dtype": fp8})
    back = decode(s, key(), s.encode(key(), chunk(x)))
    assert torch.equal(back[0], x[0])  # K bit-exact
    v = x[1].float()
    amax = float(v.abs().max()) if v.numel() else 0.0
    vscale = amax / torch.finfo(getattr(torch, fp8)).max if amax else 1.0
    rel, abs_ = FP8_BOUNDS[fp8]
    bound = (rel + DTYPE_REL[dtype]) * v.abs() * (1 + DTYPE_REL[dtype]) + abs_ * vscale
    bound += DTYPE_ABS[dtype]
    assert bool(((back[1].float() - v).abs() <= bound).all())
    # K at 16 bits, V at 8: three quarters of the chunk, plus the 8-byte scale.
    assert s.encoded_size(chunk(x)) == x.numel() // 2 * 3 + 8


def test_asym_k16_v8_other_layouts() -> None:
    s = serde({"type": "asym_k16_v8"})
    t2d = random_tensor((5, 2, 8), torch.bfloat16, 1, 1.0)
    back = decode(s, key(), s.encode(key(), chunk(t2d, MemoryFormat.KV_T2D)))
    assert torch.equal(back[:, 0], t2d[:, 0])
    mla = random_tensor((1, 2, 4, 8), torch.bfloat16, 1, 1.0)
    with pytest.raises(SerdeError, match="K/V chunk"):
        s.encode(key(), chunk(mla, MemoryFormat.KV_MLA_FMT))


@SETTINGS
@given(
    shape=shapes,
    dtype=st.sampled_from([*FLOAT_DTYPES, torch.uint8, torch.int32]),
    bits=st.sampled_from([128, 256]),
    seed=st.integers(0, 2**16),
    salt=st.text(max_size=12),
)
def test_aesgcm_is_bit_exact(
    shape: tuple[int, ...], dtype: torch.dtype, bits: int, seed: int, salt: str
) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 255, shape, generator=g, dtype=torch.uint8)
    x = (
        x.reshape(-1)[: x.numel() // dtype.itemsize * dtype.itemsize].view(dtype)
        if x.numel()
        else x.to(dtype)
    )
    s = serde(aes(aes_bits=bits))
    blob = s.encode(key(salt), chunk(x))
    back = decode(s, key(salt), blob)
    assert back.dtype == x.dtype
    assert back.reshape(-1).view(torch.uint8).tolist() == x.reshape(-1).view(torch.uint8).tolist()


def test_aesgcm_fresh_nonce_per_chunk() -> None:
    s = serde(aes())
    x = chunk(torch.zeros(64, dtype=torch.half))
    assert s.encode(key(), x) != s.encode(key(), x)


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda blob, k: (bytes(blob[:-1]) + bytes([blob[-1] ^ 1]), k), id="tag"),
        pytest.param(
            lambda blob, k: (bytes(blob[:-40]) + bytes([blob[-40] ^ 1]) + blob[-39:], k),
            id="ciphertext",
        ),
        pytest.param(lambda blob, k: (blob, key("bob")), id="other-tenant"),
        pytest.param(lambda blob, k: (blob, key("alice", chunk=8)), id="other-chunk"),
        pytest.param(lambda blob, k: (blob.replace(b'"fmt":1', b'"fmt":3'), k), id="header"),
    ],
)
def test_aesgcm_refuses_altered_or_misplaced_chunks(
    spoil: Callable[[bytes, CacheEngineKey], tuple[bytes, CacheEngineKey]],
) -> None:
    s = serde(aes())
    x = torch.randn(2, 2, 4, 8).half()
    blob = s.encode(key("alice"), chunk(x))
    bad_blob, bad_key = spoil(blob, key("alice"))
    with pytest.raises(SerdeError):
        decode(s, bad_key, bad_blob)


def test_aesgcm_other_master_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    blob = serde(aes()).encode(key(), chunk(torch.ones(8).half()))
    monkeypatch.setenv("LMC_TEST_SERDE_KEY", os.urandom(32).hex())
    with pytest.raises(SerdeError, match="authentication failed"):
        decode(serde(aes()), key(), blob)


def test_tenants_get_different_ciphertexts_and_keys() -> None:
    from lmcache.v1.storage_backend.serde.key_provider import HkdfKeyProvider

    provider = HkdfKeyProvider(MASTER, 32, b"p")
    assert provider.get_key("alice") != provider.get_key("bob")
    assert provider.get_key("alice") != HkdfKeyProvider(MASTER, 32, b"q").get_key("alice")
    assert len(provider.get_key("")) == 32


@SETTINGS
@given(shape=kv_shapes, seed=st.integers(0, 2**16))
def test_multi_equals_its_stages_in_order(shape: tuple[int, ...], seed: int) -> None:
    x = random_tensor(shape, torch.bfloat16, seed, 1.0)
    for quantizer in ({"type": "fp8"}, {"type": "asym_k16_v8"}):
        alone = serde(quantizer)
        chained = serde({"type": "multi", "serdes": [quantizer, aes()]})
        assert chained.spec == alone.spec + "+aesgcm:256"
        expected = decode(alone, key(), alone.encode(key(), chunk(x)))
        got = decode(chained, key(), chained.encode(key(), chunk(x)))
        assert torch.equal(got, expected)


def test_reading_with_another_or_no_serde_is_refused() -> None:
    x = chunk(torch.randn(2, 2, 4, 8).half())
    fp8 = serde({"type": "fp8"})
    blob = fp8.encode(key(), x)
    for other in ({"type": "fp8", "fp8_dtype": "float8_e5m2"}, {"type": "asym_k16_v8"}, aes()):
        with pytest.raises(SerdeError, match="written by serde 'fp8:float8_e4m3fn'"):
            decode(serde(other), key(), blob)
    raw = bytes(x.byte_array)  # a chunk stored without a serde
    with pytest.raises(SerdeError, match="bad magic"):
        decode(fp8, key(), raw)
    with pytest.raises(SerdeError):
        decode(fp8, key(), blob[:10])
    with pytest.raises(SerdeError):
        decode(fp8, key(), blob[:-1])


def test_multi_part_objects_round_trip() -> None:
    shapes_ = [torch.Size([2, 3]), torch.Size([5])]
    dtypes = [torch.float16, torch.float32]
    obj = allocate_for_read(None, shapes_, dtypes, MemoryFormat.UNDEFINED)
    assert obj is not None
    for i in range(2):
        part = obj.get_tensor(i)
        assert part is not None
        part.copy_(torch.linspace(-2, 2, part.numel()).reshape(part.shape))
    for spec in ({"type": "fp8"}, aes()):
        s = serde(spec)
        back = s.decode(
            key(), s.encode(key(), obj), lambda sh, dt, f: allocate_for_read(None, sh, dt, f)
        )
        assert back is not None
        assert back.get_shapes() == shapes_ and back.get_dtypes() == dtypes
        for i in range(2):
            a, b = back.get_tensor(i), obj.get_tensor(i)
            assert a is not None and b is not None
            assert torch.allclose(a.float(), b.float(), rtol=2**-4, atol=2**-10)
