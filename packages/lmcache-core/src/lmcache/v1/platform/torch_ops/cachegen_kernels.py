"""CacheGen entropy coding: per-(layer, channel) CDFs and an arithmetic (range) coder.

Every (layer, channel) pair is one independent stream of ``ntokens`` symbols. The coder is
Subbotin's carry-less range coder with 32-bit unsigned state (overflow emulated with masks),
run for all streams at once in numpy: the Python loop runs over tokens only, every step is a
vector op across all streams.

Bitstream format (what a native backend must reproduce to be bit-exact):
- CDF rows are int16 ``[0 = c_0 < ... < c_n = total]`` read as uint16; ``calculate_cdf``
  emits ``total = 32767`` and gives every bin a frequency of at least 1.
- Encoder state ``low = 0, range = 2**32 - 1``. Per symbol ``s``: ``r = range // total``,
  ``low += c_s * r``, ``range = r * (c_{s+1} - c_s)``, then while the top byte of ``low`` and
  ``low + range`` agree, or ``range < 2**16`` (then ``range = -low & 0xFFFF`` first): emit
  ``low >> 24`` and shift ``low`` and ``range`` left by 8. After the last symbol the four
  bytes of ``low`` are emitted, most significant first.
- The decoder mirrors it, reading bytes past a stream's end as zero.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["calculate_cdf", "decode_fast_new", "decode_fast_prefsum", "encode_fast_new"]

CDF_TOTAL = 32767
_MASK32 = np.uint64(0xFFFFFFFF)
_TOP = np.uint64(1 << 24)
_BOTTOM = np.uint64(1 << 16)
_EIGHT = np.uint64(8)
_FLUSH_BYTES = 4


def calculate_cdf(input_tensor: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Normalized CDF per (layer, channel) over tokens: int16 ``[L, C, num_bins + 1]``.

    ``input_tensor`` is ``[nlayers, ntokens, nchannels]`` of symbols in ``[0, num_bins)``.
    """
    if input_tensor.dim() != 3:
        raise ValueError(
            f"input_tensor must be [nlayers, ntokens, nchannels], got {input_tensor.shape}"
        )
    if not 0 < num_bins <= CDF_TOTAL // 2:
        raise ValueError(f"num_bins must be in [1, {CDF_TOTAL // 2}], got {num_bins}")
    layers, tokens, channels = input_tensor.shape
    symbols = input_tensor.to("cpu", torch.int64)
    _check_symbols(symbols, num_bins)
    stream = torch.arange(layers * channels).view(layers, 1, channels)
    flat = (stream * num_bins + symbols).reshape(-1)
    counts = torch.bincount(flat, minlength=layers * channels * num_bins)
    counts = counts.view(layers, channels, num_bins)
    # Every bin keeps frequency >= 1 so any in-range symbol stays encodable; the rounding
    # remainder goes to the most frequent bin.
    freq = counts * (CDF_TOTAL - num_bins) // max(tokens, 1) + 1
    deficit = CDF_TOTAL - freq.sum(-1, keepdim=True)
    freq.scatter_add_(-1, counts.argmax(-1, keepdim=True), deficit)
    cdf = torch.zeros(layers, channels, num_bins + 1, dtype=torch.int64)
    cdf[..., 1:] = freq.cumsum(-1)
    return cdf.to(torch.int16)


def _check_symbols(symbols: torch.Tensor, num_bins: int) -> None:
    if symbols.numel() and (int(symbols.min()) < 0 or int(symbols.max()) >= num_bins):
        raise ValueError(f"symbols must lie in [0, {num_bins})")


def _cdf_rows(cdf: torch.Tensor) -> np.ndarray:
    """CDF as uint64 ``[streams, bins + 1]`` (int16 storage read as uint16)."""
    rows = cdf.to("cpu", torch.int64).reshape(-1, cdf.shape[-1]).numpy() & 0xFFFF
    # A total of 65536 (the full 16-bit range) wraps to 0 in int16 storage: upstream's
    # normalised CDFs end that way, so a trailing 0 reads as 65536.
    rows[:, -1] = np.where(rows[:, -1] == 0, 1 << 16, rows[:, -1])
    if np.any(rows[:, -1] > 1 << 16):
        raise ValueError("every CDF row must end with a total in [1, 65536]")
    return rows.astype(np.uint64)


def _emit(
    low: np.ndarray, rng: np.ndarray, active: np.ndarray, out: np.ndarray, pos: np.ndarray
) -> None:
    """Shift one byte out of the active streams (encoder side)."""
    idx = np.flatnonzero(active)
    out[idx, np.minimum(pos[idx], out.shape[1] - 1)] = (low[idx] >> np.uint64(24)).astype(np.uint8)
    pos[idx] += 1
    low[idx] = (low[idx] << _EIGHT) & _MASK32
    rng[idx] = (rng[idx] << _EIGHT) & _MASK32


def _absorb(
    low: np.ndarray,
    rng: np.ndarray,
    active: np.ndarray,
    data: np.ndarray,
    pos: np.ndarray,
    code: np.ndarray,
) -> None:
    """Shift one byte into the active streams (decoder side)."""
    idx = np.flatnonzero(active)
    code[idx] = ((code[idx] << _EIGHT) | data[idx, pos[idx]]) & _MASK32
    pos[idx] += 1
    low[idx] = (low[idx] << _EIGHT) & _MASK32
    rng[idx] = (rng[idx] << _EIGHT) & _MASK32


def _needs_shift(low: np.ndarray, rng: np.ndarray) -> np.ndarray:
    """Streams that must shift a byte now; narrows ``rng`` of underflowing ones in place."""
    settled = (low ^ ((low + rng) & _MASK32)) < _TOP
    underflow = ~settled & (rng < _BOTTOM)
    rng[underflow] = (-low[underflow].astype(np.int64)).astype(np.uint64) & (_BOTTOM - np.uint64(1))
    return settled | underflow


def _narrow(
    cdf: np.ndarray, symbols: np.ndarray, low: np.ndarray, rng: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    rows = np.arange(cdf.shape[0])
    cum = cdf[rows, symbols]
    freq = cdf[rows, symbols + 1] - cum
    step = rng // cdf[:, -1]
    return (low + cum * step) & _MASK32, step * freq


def _encode_streams(
    cdf: np.ndarray, symbols: np.ndarray, capacity: int
) -> tuple[np.ndarray, np.ndarray]:
    """Encode ``symbols`` ``[streams, tokens]`` into (bytes ``[streams, capacity]``, lengths)."""
    streams, tokens = symbols.shape
    out = np.zeros((streams, max(capacity, 1)), dtype=np.uint8)
    pos = np.zeros(streams, dtype=np.int64)
    low = np.zeros(streams, dtype=np.uint64)
    rng = np.full(streams, _MASK32, dtype=np.uint64)
    for t in range(tokens):
        low, rng = _narrow(cdf, symbols[:, t], low, rng)
        active = _needs_shift(low, rng)
        while active.any():
            _emit(low, rng, active, out, pos)
            active = _needs_shift(low, rng)
    everyone = np.ones(streams, dtype=bool)
    for _ in range(_FLUSH_BYTES):
        _emit(low, rng, everyone, out, pos)
    if int(pos.max(initial=0)) > capacity:
        raise ValueError(
            f"output_buffer holds {capacity} bytes per stream, a stream needs {int(pos.max())}"
        )
    return out[:, :capacity], pos


def _decode_streams(cdf: np.ndarray, data: np.ndarray, tokens: int) -> np.ndarray:
    """Decode ``tokens`` symbols per stream from zero-padded ``data`` ``[streams, bytes]``."""
    streams = data.shape[0]
    data = np.concatenate([data, np.zeros((streams, _FLUSH_BYTES + 8), np.uint8)], axis=1)
    data = data.astype(np.uint64)
    code = np.zeros(streams, dtype=np.uint64)
    for i in range(_FLUSH_BYTES):
        code = (code << _EIGHT) | data[:, i]
    pos = np.full(streams, _FLUSH_BYTES, dtype=np.int64)
    low = np.zeros(streams, dtype=np.uint64)
    rng = np.full(streams, _MASK32, dtype=np.uint64)
    totals = cdf[:, -1]
    upper = cdf[:, 1:]
    decoded = np.empty((streams, tokens), dtype=np.int64)
    for t in range(tokens):
        value = np.minimum(((code - low) & _MASK32) // (rng // totals), totals - np.uint64(1))
        symbols = (upper <= value[:, None]).sum(axis=1)
        decoded[:, t] = symbols
        low, rng = _narrow(cdf, symbols, low, rng)
        active = _needs_shift(low, rng)
        while active.any():
            _absorb(low, rng, active, data, pos, code)
            active = _needs_shift(low, rng)
    return decoded


def _stream_symbols(input_sym: torch.Tensor) -> np.ndarray:
    """``[L, T, C]`` symbols as ``[L*C, T]`` int64 streams."""
    layers, tokens, channels = input_sym.shape
    return (
        input_sym.to("cpu", torch.int64).permute(0, 2, 1).reshape(layers * channels, tokens).numpy()
    )


def encode_fast_new(
    cdf: torch.Tensor,
    input_sym: torch.Tensor,
    output_buffer: torch.Tensor,
    output_lengths: torch.Tensor,
) -> None:
    """Encode ``input_sym`` ``[L, T, C]`` with ``cdf`` ``[L, C, bins+1]``.

    Writes each stream's bytes into ``output_buffer`` ``[L, C, capacity]`` (uint8) and its
    byte count into ``output_lengths`` ``[L, C]``; ValueError when a stream does not fit.
    """
    rows = _cdf_rows(cdf)
    symbols = _stream_symbols(input_sym)
    _check_symbols(torch.from_numpy(symbols), rows.shape[1] - 1)
    if rows.shape[0] != symbols.shape[0]:
        raise ValueError(f"cdf has {rows.shape[0]} streams, input_sym {symbols.shape[0]}")
    capacity = output_buffer.shape[-1]
    data, lengths = _encode_streams(rows, symbols, capacity)
    output_buffer.copy_(torch.from_numpy(data).view(output_buffer.shape))
    output_lengths.copy_(torch.from_numpy(lengths).view(output_lengths.shape))


def _write_decoded(decoded: np.ndarray, output: torch.Tensor) -> None:
    layers, tokens, channels = output.shape
    symbols = torch.from_numpy(decoded).view(layers, channels, tokens).permute(0, 2, 1)
    output.copy_(symbols.to(output.dtype))


def decode_fast_new(
    cdf: torch.Tensor, bytestreams: torch.Tensor, lengths: torch.Tensor, output: torch.Tensor
) -> None:
    """Decode ``bytestreams`` ``[L, C, capacity]`` (``lengths`` ``[L, C]``) into ``output``
    ``[L, T, C]``."""
    rows = _cdf_rows(cdf)
    data = bytestreams.to("cpu", torch.uint8).reshape(rows.shape[0], -1).numpy()
    lens = lengths.to("cpu", torch.int64).reshape(-1, 1).numpy()
    data = np.where(np.arange(data.shape[1])[None, :] < lens, data, 0).astype(np.uint8)
    _write_decoded(_decode_streams(rows, data, output.shape[1]), output)


def decode_fast_prefsum(
    cdf: torch.Tensor,
    bytestreams: torch.Tensor,
    lengths_prefsum: torch.Tensor,
    output: torch.Tensor,
) -> None:
    """Decode streams packed back to back in 1-d ``bytestreams``; ``lengths_prefsum`` holds
    the inclusive prefix sums of the stream lengths (stream i ends at ``prefsum[i]``)."""
    rows = _cdf_rows(cdf)
    packed = bytestreams.to("cpu", torch.uint8).reshape(-1).numpy()
    ends = lengths_prefsum.to("cpu", torch.int64).reshape(-1).numpy()
    starts = np.concatenate([[0], ends[:-1]])
    lens = ends - starts
    width = int(lens.max(initial=0))
    offsets = np.arange(width)[None, :]
    index = np.minimum(starts[:, None] + offsets, max(packed.size - 1, 0))
    data = np.where(offsets < lens[:, None], packed[index] if packed.size else 0, 0)
    _write_decoded(_decode_streams(rows, data.astype(np.uint8), output.shape[1]), output)
