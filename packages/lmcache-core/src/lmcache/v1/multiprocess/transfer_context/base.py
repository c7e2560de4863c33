"""The worker-side transfer context's interface and small helpers shared by both modes."""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from lmcache.v1.multiprocess.wire.custom_types import EngineType, IPCCacheServerKey
from lmcache.v1.platform.kv_layout import KVLayout
from lmcache.v1.platform.transfer_mode import MPTransferMode

logger = logging.getLogger(__name__)

MessagingFuture = Future


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


def _failed(exc: BaseException) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(exc)
    return future


def _tensor_list(
    kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
) -> list[torch.Tensor]:
    return list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)


class TransferContext(abc.ABC):
    """One worker's connection of its KV cache to the server."""

    mode: MPTransferMode

    def __init__(self, instance_id: int, req_client: Any) -> None:
        self.instance_id = instance_id
        self.req_client = req_client
        self.chunk_size = 0
        self.layout: KVLayout | None = None
        self._kv: list[torch.Tensor] = []

    @abc.abstractmethod
    def register(
        self,
        kv_caches: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
        model_name: str,
        world_size: int,
        blocks_in_chunk: int,
        mq_timeout: float,
        layout_hints: Any = None,
        engine_group_infos: Sequence[Any] = (),
        engine_type: EngineType = EngineType.VLLM,
    ) -> None: ...

    @abc.abstractmethod
    def register_again(self) -> None:
        """Register once more, as the last ``register`` did, with a server that restarted.

        The new server process never knew this worker, so nothing is unregistered first.
        """

    @abc.abstractmethod
    def unregister(self) -> Future[Any] | None: ...

    def create_recorded_event(self) -> Any:
        return None

    @abc.abstractmethod
    def submit_store(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: Any,
        blocks_in_chunk: int,
    ) -> Future[bool]: ...

    @abc.abstractmethod
    def submit_retrieve(
        self,
        request_id: str,
        key: IPCCacheServerKey,
        kv_caches: Any,
        block_ids: list[list[int]],
        event: Any,
        blocks_in_chunk: int,
        skip_first_n_tokens: int = 0,
    ) -> Future[bool]: ...

    def flush_inflight_stores(self) -> None:  # noqa: B027 - nothing in flight by default
        """Stores complete before ``submit_store`` returns; nothing is in flight."""

    def close(self) -> None:
        try:
            self.unregister()
        except Exception:
            logger.debug("unregister during close failed", exc_info=True)

    def _setup(self, kv: list[torch.Tensor], blocks_in_chunk: int) -> KVLayout:
        layout = KVLayout.from_tensors(kv)
        self.layout = layout
        self._kv = kv
        self.chunk_size = blocks_in_chunk * layout.block_size
        return layout
