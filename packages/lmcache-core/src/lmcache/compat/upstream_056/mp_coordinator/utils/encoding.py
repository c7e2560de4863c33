"""Upstream's ``lmcache.v1.mp_coordinator.utils.encoding``: the checkpoint key encoding
(:mod:`lmcache.compat.upstream_056.distributed.key_encoding`)."""

from __future__ import annotations

from lmcache.compat.upstream_056.distributed.key_encoding import (
    EncodedKey,
    decode_key,
    encode_key,
)

__all__ = ["EncodedKey", "decode_key", "encode_key"]
