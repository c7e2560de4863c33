"""Upstream's path for the wire payload types, which live in
:mod:`lmcache.v1.multiprocess.wire.custom_types`; kept so upstream code imports unchanged.
``KVCache`` (the registered ``list[DeviceIPCWrapper]``) is
:data:`lmcache.v1.platform.kv_wrap.KVCache`.
``get_customized_encoder`` / ``get_customized_decoder`` are upstream's names for the wire's
msgpack codec (:func:`lmcache.v1.multiprocess.wire.protocol.wire_decoder`)."""

from typing import Any as _Any

import msgspec as _msgspec

from lmcache.v1.multiprocess.wire.custom_types import *  # noqa: F403
from lmcache.v1.multiprocess.wire.custom_types import __all__ as _wire_all
from lmcache.v1.multiprocess.wire.protocol import wire_decoder as _wire_decoder
from lmcache.v1.multiprocess.wire.protocol import wire_encoder as _wire_encoder
from lmcache.v1.platform.kv_wrap import KVCache

__all__ = [*_wire_all, "KVCache"]


def get_customized_encoder(type: _Any) -> _msgspec.msgpack.Encoder:
    """The wire encoder (``type`` is unused, as upstream's)."""
    return _wire_encoder()


def get_customized_decoder(type: _Any) -> _msgspec.msgpack.Decoder[_Any]:
    """A decoder for ``type`` with the wire's hooks (IPC wrappers, dtypes)."""
    return _wire_decoder(type)
