"""CacheGen codec: CDF shape/normalization and exact encode/decode round trips."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st


def test_cdf_shape_dtype_and_monotonic(ops: Any) -> None:
    symbols = torch.randint(0, 16, (3, 50, 7))
    cdf = ops.calculate_cdf(symbols, 16)
    assert cdf.dtype == torch.int16 and cdf.shape == (3, 7, 17)
    assert (cdf[..., 0] == 0).all()
    assert (cdf[..., -1] == cdf[0, 0, -1]).all()
    assert (cdf[..., 1:] > cdf[..., :-1]).all()  # every bin encodable


def test_cdf_follows_the_histogram(ops: Any) -> None:
    symbols = torch.zeros(1, 100, 1, dtype=torch.int64)
    symbols[0, :75, 0] = 2
    cdf = ops.calculate_cdf(symbols, 4).long()[0, 0]
    freq = cdf[1:] - cdf[:-1]
    assert freq[2] > 2.5 * freq[0] > 0 and freq[1] == freq[3]


def round_trip(ops: Any, symbols: torch.Tensor, num_bins: int) -> None:
    layers, tokens, channels = symbols.shape
    cdf = ops.calculate_cdf(symbols, num_bins)
    out = torch.zeros(layers, channels, 4 * tokens + 8, dtype=torch.uint8)
    lengths = torch.zeros(layers, channels, dtype=torch.int32)
    ops.encode_fast_new(cdf, symbols, out, lengths)
    decoded = torch.zeros_like(symbols)
    ops.decode_fast_new(cdf, out, lengths, decoded)
    assert torch.equal(decoded, symbols)
    packed = torch.cat([out[i, c, : lengths[i, c]] for i in range(layers) for c in range(channels)])
    prefsum = lengths.reshape(-1).long().cumsum(0)
    decoded2 = torch.zeros_like(symbols)
    ops.decode_fast_prefsum(cdf, packed, prefsum, decoded2)
    assert torch.equal(decoded2, symbols)


def test_round_trip_compresses_skewed_data(ops: Any) -> None:
    gen = torch.Generator().manual_seed(0)
    symbols = torch.multinomial(torch.tensor([0.7, 0.2, 0.05, 0.05] + [0.0] * 28), 2 * 256 * 64,
                                replacement=True, generator=gen).view(2, 256, 64)  # fmt: skip
    round_trip(ops, symbols, 32)
    cdf = ops.calculate_cdf(symbols, 32)
    out = torch.zeros(2, 64, 2048, dtype=torch.uint8)
    lengths = torch.zeros(2, 64, dtype=torch.int32)
    ops.encode_fast_new(cdf, symbols, out, lengths)
    assert lengths.float().mean() < 256 * 0.25  # ~1.3 bits/symbol vs 8


@settings(max_examples=30, deadline=None)
@given(
    layers=st.integers(1, 3),
    tokens=st.integers(1, 40),
    channels=st.integers(1, 9),
    num_bins=st.integers(1, 64),
    seed=st.integers(0, 2**16),
)
def test_round_trip_random(ops: Any, layers: int, tokens: int, channels: int, num_bins: int,
                           seed: int) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    symbols = torch.randint(0, num_bins, (layers, tokens, channels), generator=gen)
    round_trip(ops, symbols, num_bins)


def test_too_small_output_buffer_and_bad_symbols(ops: Any) -> None:
    symbols = torch.randint(0, 8, (1, 64, 2))
    cdf = ops.calculate_cdf(symbols, 8)
    with pytest.raises(ValueError, match="output_buffer"):
        ops.encode_fast_new(cdf, symbols, torch.zeros(1, 2, 4, dtype=torch.uint8),
                            torch.zeros(1, 2, dtype=torch.int32))  # fmt: skip
    with pytest.raises(ValueError, match="symbols"):
        ops.calculate_cdf(torch.full((1, 2, 1), 9), 8)
