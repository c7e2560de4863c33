"""CacheEngineKey forms, rolling prefix hashes and size parsing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lmcache.utils import (
    CacheEngineKey,
    LayerCacheEngineKey,
    chunk_hashes,
    chunk_keys,
    parse_cache_key,
    parse_size,
)


def test_key_string_form_and_roundtrips() -> None:
    key = CacheEngineKey("org/llama", 4, 1, 0xABC, torch.bfloat16, {"lmcache.tag.user": "u1"})
    assert str(key) == "org/llama@4@1@abc@bfloat16@user%u1"
    assert key.chunk_hash_hex == "abc"
    assert CacheEngineKey.from_string(str(key)) == key
    assert CacheEngineKey.from_bytes(key.to_bytes()) == key
    d = key.to_dict()
    assert d["__type__"] == "CacheEngineKey" and CacheEngineKey.from_dict(d) == key
    assert parse_cache_key(str(key)) == key


def test_key_is_frozen_hashable_and_ignores_non_tag_configs() -> None:
    a = CacheEngineKey("m", 1, 0, 5, torch.half, {"other": 1})
    b = CacheEngineKey("m", 1, 0, 5, torch.half)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != CacheEngineKey("m", 1, 0, 5, torch.float)
    assert a != CacheEngineKey("m", 1, 0, 5, torch.half, {"lmcache.tag.t": "x"})
    with pytest.raises(AttributeError):
        a.chunk_hash = 6  # type: ignore[misc]


def test_layer_keys() -> None:
    key = CacheEngineKey("m", 2, 1, 255, torch.half)
    layers = key.split_layers(3)
    assert [lk.layer_id for lk in layers] == [0, 1, 2]
    assert str(layers[2]) == "m@2@1@ff@half@2"
    assert parse_cache_key(str(layers[2])) == layers[2]
    assert isinstance(CacheEngineKey.from_dict(layers[1].to_dict()), LayerCacheEngineKey)
    assert layers[0] != key and key.get_first_layer() == layers[0]
    assert key.with_new_worker_id(7).worker_id == 7


@given(st.lists(st.integers(0, 2**31), min_size=0, max_size=40), st.integers(1, 8))
def test_chunk_hashes_are_prefix_hashes(tokens: list[int], chunk: int) -> None:
    full = chunk_hashes(tokens, chunk)
    assert len(full) == -(-len(tokens) // chunk)
    assert len(chunk_hashes(tokens, chunk, save_unfull_chunk=False)) == len(tokens) // chunk
    # Same prefix, same hashes; a changed token changes its chunk's and all later hashes.
    if tokens:
        changed = [*tokens[:-1], tokens[-1] + 1]
        other = chunk_hashes(changed, chunk)
        assert other[:-1] == full[:-1] and other[-1] != full[-1]
    assert chunk_hashes(torch.tensor(tokens, dtype=torch.int64), chunk) == full


def test_chunk_hashes_are_stable_across_processes() -> None:
    # The parent runs with a random string-hash seed; the child with a fixed, different one.
    code = "from lmcache.utils import chunk_hashes; print(chunk_hashes(list(range(600))))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    ).stdout
    assert out.strip() == str(chunk_hashes(list(range(600))))


def test_chunk_keys() -> None:
    keys = chunk_keys(list(range(300)), "m", 1, 0, torch.half, chunk_size=256)
    assert len(keys) == 2 and keys[0].chunk_hash == chunk_hashes(list(range(300)))[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10GB", 10 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("1.5g", int(1.5 * 1024**3)),
        ("4096", 4096),
        (" 2 KB ", 2048),
        (0, 0),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "ten", "-1GB", "5 parsecs", True])
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)  # type: ignore[arg-type]


def test_process_is_running_sees_live_zombie_and_reaped_children() -> None:
    import subprocess
    import sys
    import time

    from lmcache.utils import process_is_running

    assert process_is_running(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # exited but not reaped: a zombie, not running
        with open(f"/proc/{child.pid}/stat") as stat:
            if stat.read().rsplit(") ", 1)[1].startswith("Z"):
                break
        time.sleep(0.01)
    else:
        raise AssertionError("the child never became a zombie")
    assert not process_is_running(child.pid)
    child.wait()
    assert not process_is_running(child.pid)
