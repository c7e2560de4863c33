"""``DeviceOps``: the per-device op surface, delegating to the torch baseline by default.

Every public op of :mod:`lmcache.v1.platform.torch_ops` is a method here with the same
signature.  A vendor subclass overrides methods directly, or calls :meth:`bind_native` from
:meth:`ensure_native` to overlay a whole native module: instance attributes shadow the
class methods, so whatever the module leaves out keeps using the baseline.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, ClassVar

import torch

from lmcache.v1.platform import ops_types
from lmcache.v1.platform.base import op_signatures
from lmcache.v1.platform.base.baseline import torch_baseline

logger = logging.getLogger(__name__)


class _BaselineOp:
    """A ``DeviceOps`` method calling the ``torch_ops`` op of its name, with its signature.

    The baseline function is the op's only run-time declaration: its parameters, defaults
    and documentation become the method's (plus a positional-only ``self``) the first time
    the method is looked up.  A non-data descriptor, so ``bind_native``'s instance
    attributes still shadow it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._method: Callable[..., None] | None = None
        self._lock = threading.Lock()

    def _build(self) -> Callable[..., None]:
        name = self.name
        declaration = getattr(torch_baseline(), name)

        @functools.wraps(declaration)
        def method(self: DeviceOps, *args: object, **kwargs: object) -> None:
            getattr(torch_baseline(), name)(*args, **kwargs)

        signature = inspect.signature(declaration)
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
        method.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[self_param, *signature.parameters.values()]
        )
        method.__module__ = __name__
        method.__qualname__ = f"DeviceOps.{name}"
        return method

    def function(self) -> Callable[..., None]:
        with self._lock:
            if self._method is None:
                self._method = self._build()
            return self._method

    def __get__(self, instance: object, owner: type | None = None) -> Callable[..., None]:
        method = self.function()
        return method if instance is None else types.MethodType(method, instance)


class DeviceOps:
    """Strategy object for one device; ``lmcache.device_ops`` is the selected backend's."""

    device_type: ClassVar[str] = ""

    # Types callers construct through the ops object so native overlays take effect.
    TransferDirection: type[ops_types.TransferDirection] = ops_types.TransferDirection
    EngineKVFormat: type[ops_types.EngineKVFormat] = ops_types.EngineKVFormat
    GPUKVFormat: type[ops_types.EngineKVFormat] = ops_types.EngineKVFormat
    TransferPhase: type[ops_types.TransferPhase] = ops_types.TransferPhase
    PageBufferShapeDesc: type[ops_types.PageBufferShapeDesc] = ops_types.PageBufferShapeDesc
    KernelGroupSpec: type[ops_types.KernelGroupSpec] = ops_types.KernelGroupSpec
    StagingCopy: type[ops_types.StagingCopy] = ops_types.StagingCopy
    LaunchVar: type[ops_types.LaunchVar] = ops_types.LaunchVar
    BatchStep: type[ops_types.BatchStep] = ops_types.BatchStep

    def __init__(self) -> None:
        self._native_bound = False
        self._native_module_name: str | None = None
        self._native_symbols: tuple[str, ...] = ()

    if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt op is a static error

        def __getattr__(self, name: str) -> object:
            # Only reached for names that do not exist: lets hasattr() detect optional
            # native-only ops without a try/except at every call site.
            raise AttributeError(f"{type(self).__name__} has no device operation {name!r}")

    # -- native binding -----------------------------------------------------------------
    def ensure_native(self) -> None:
        """Bind native ops; the base keeps the torch baseline for everything."""
        return None

    def bind_native(self, module: types.ModuleType | object) -> None:
        """Overlay every public function and class of ``module`` onto this instance."""
        num_ops = num_types = 0
        bound: list[str] = []
        for name in dir(module):
            if name.startswith("_"):
                continue
            value = getattr(module, name, None)
            if value is None or isinstance(value, types.ModuleType):
                continue
            if isinstance(value, type):
                num_types += 1
            elif callable(value):
                num_ops += 1
            else:
                continue
            setattr(self, name, value)
            bound.append(name)
        engine_kv_format = getattr(module, "EngineKVFormat", None)
        if engine_kv_format is not None:
            self.GPUKVFormat = engine_kv_format
        self._native_bound = True
        self._native_module_name = getattr(module, "__name__", repr(module))
        self._native_symbols = tuple(sorted(bound))
        logger.debug(
            "bind_native: %s <- %s (%d ops, %d types)",
            type(self).__name__,
            self._native_module_name,
            num_ops,
            num_types,
        )

    @property
    def native_module_name(self) -> str | None:
        """Name of the bound native module, or None on the pure torch baseline."""
        return self._native_module_name

    @property
    def native_symbols(self) -> tuple[str, ...]:
        """Names the native module overlaid (empty on the pure torch baseline)."""
        return self._native_symbols

    # -- host memory --------------------------------------------------------------------
    def alloc_pinned_ptr(self, size: int, device_id: int = 0) -> int:
        return torch_baseline().alloc_pinned_ptr(size, device_id)

    def free_pinned_ptr(self, ptr: int) -> None:
        torch_baseline().free_pinned_ptr(ptr)

    def alloc_pinned_numa_ptr(self, size: int, numa_id: int = 0) -> int:
        return torch_baseline().alloc_pinned_numa_ptr(size, numa_id)

    def free_pinned_numa_ptr(self, ptr: int, size: int | None = None) -> None:
        torch_baseline().free_pinned_numa_ptr(ptr, size)

    def alloc_numa_ptr(self, size: int, numa_id: int = 0) -> int:
        return torch_baseline().alloc_numa_ptr(size, numa_id)

    def free_numa_ptr(self, ptr: int, size: int | None = None) -> None:
        torch_baseline().free_numa_ptr(ptr, size)

    def alloc_shm_pinned_ptr(self, size: int, shm_name: str = "") -> int:
        return torch_baseline().alloc_shm_pinned_ptr(size, shm_name)

    def free_shm_pinned_ptr(self, ptr: int, size: int = 0, shm_name: str = "") -> None:
        torch_baseline().free_shm_pinned_ptr(ptr, size, shm_name)

    def alloc_hugepage_pinned_ptr(self, size: int, device_id: int = 0) -> int:
        return torch_baseline().alloc_hugepage_pinned_ptr(size, device_id)

    def free_hugepage_pinned_ptr(self, ptr: int, size: int = 0) -> None:
        torch_baseline().free_hugepage_pinned_ptr(ptr, size)

    def alloc_hugepage_pinned_numa_ptr(self, size: int, numa_id: int = 0) -> int:
        return torch_baseline().alloc_hugepage_pinned_numa_ptr(size, numa_id)

    def free_hugepage_pinned_numa_ptr(self, ptr: int, size: int = 0) -> None:
        torch_baseline().free_hugepage_pinned_numa_ptr(ptr, size)

    def batched_memcpy(self, src_ptrs: list[int], dst_ptrs: list[int], sizes: list[int]) -> None:
        torch_baseline().batched_memcpy(src_ptrs, dst_ptrs, sizes)

    def tensor_from_ptr(
        self,
        ptr: int,
        shape: Sequence[int],
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        return torch_baseline().tensor_from_ptr(ptr, shape, dtype, device)

    # -- KV transfer: declared by the torch_ops functions (see _BaselineOp) -------------
    # Type checkers see the callback protocols of op_signatures instead (same signatures).
    # lmcache_memcpy_async is positional only, like the native binding.
    if TYPE_CHECKING:
        multi_layer_block_kv_transfer: op_signatures.MultiLayerBlockKVTransfer
        multi_layer_kv_transfer: op_signatures.MultiLayerKVTransfer
        multi_layer_kv_transfer_unilateral: op_signatures.MultiLayerKVTransferUnilateral
        single_layer_kv_transfer: op_signatures.SingleLayerKVTransfer
        single_layer_kv_transfer_sgl: op_signatures.SingleLayerKVTransferSgl
        load_and_reshape_flash: op_signatures.LoadAndReshapeFlash
        reshape_and_cache_back_flash: op_signatures.ReshapeAndCacheBackFlash
        lmcache_memcpy_async: op_signatures.LmcacheMemcpyAsync
    else:
        multi_layer_block_kv_transfer = _BaselineOp("multi_layer_block_kv_transfer")
        multi_layer_kv_transfer = _BaselineOp("multi_layer_kv_transfer")
        multi_layer_kv_transfer_unilateral = _BaselineOp("multi_layer_kv_transfer_unilateral")
        single_layer_kv_transfer = _BaselineOp("single_layer_kv_transfer")
        single_layer_kv_transfer_sgl = _BaselineOp("single_layer_kv_transfer_sgl")
        load_and_reshape_flash = _BaselineOp("load_and_reshape_flash")
        reshape_and_cache_back_flash = _BaselineOp("reshape_and_cache_back_flash")
        lmcache_memcpy_async = _BaselineOp("lmcache_memcpy_async")

    # -- CacheGen codec -----------------------------------------------------------------
    def calculate_cdf(self, input_tensor: torch.Tensor, num_bins: int) -> torch.Tensor:
        return torch_baseline().calculate_cdf(input_tensor, num_bins)

    def encode_fast_new(
        self,
        cdf: torch.Tensor,
        input_sym: torch.Tensor,
        output_buffer: torch.Tensor,
        output_lengths: torch.Tensor,
    ) -> None:
        torch_baseline().encode_fast_new(cdf, input_sym, output_buffer, output_lengths)

    def decode_fast_new(
        self,
        cdf: torch.Tensor,
        bytestreams: torch.Tensor,
        lengths: torch.Tensor,
        output: torch.Tensor,
    ) -> None:
        torch_baseline().decode_fast_new(cdf, bytestreams, lengths, output)

    def decode_fast_prefsum(
        self,
        cdf: torch.Tensor,
        bytestreams: torch.Tensor,
        lengths_prefsum: torch.Tensor,
        output: torch.Tensor,
    ) -> None:
        torch_baseline().decode_fast_prefsum(cdf, bytestreams, lengths_prefsum, output)

    # -- stream-ordered recording -------------------------------------------------------
    def record_event_on_stream(
        self,
        cuda_stream_ptr: int,
        event_type_name: str,
        session_id: str,
        str_metadata: dict[str, str],
        int_metadata: dict[str, int],
        /,
    ) -> None:
        torch_baseline().record_event_on_stream(
            cuda_stream_ptr, event_type_name, session_id, str_metadata, int_metadata
        )

    def drain_recorded_events(self) -> list[ops_types.EventRecord]:
        return torch_baseline().drain_recorded_events()

    def record_completion_on_stream(
        self, cuda_stream_ptr: int, kind: str, payload: bytes, /
    ) -> None:
        torch_baseline().record_completion_on_stream(cuda_stream_ptr, kind, payload)

    def drain_recorded_completions(self) -> list[tuple[str, bytes]]:
        return torch_baseline().drain_recorded_completions()

    # -- positional encoding ------------------------------------------------------------
    def rotary_embedding_k_fused(
        self,
        old_positions: torch.Tensor,
        new_positions: torch.Tensor,
        key: torch.Tensor,
        head_size: int,
        cos_sin_cache: torch.Tensor,
        is_neox: bool,
        /,
    ) -> None:
        torch_baseline().rotary_embedding_k_fused(
            old_positions, new_positions, key, head_size, cos_sin_cache, is_neox
        )

    def rotary_embedding_k_fused_strided(
        self,
        old_positions: torch.Tensor,
        new_positions: torch.Tensor,
        key: torch.Tensor,
        head_size: int,
        head_stride: int,
        cos_sin_cache: torch.Tensor,
        is_neox: bool,
        /,
    ) -> None:
        torch_baseline().rotary_embedding_k_fused_strided(
            old_positions, new_positions, key, head_size, head_stride, cos_sin_cache, is_neox
        )

    # -- misc ---------------------------------------------------------------------------
    def get_gpu_pci_bus_id(self, device_id: int = 0) -> str | None:
        return torch_baseline().get_gpu_pci_bus_id(device_id)


# Names of every op method, for conformance tests and ``lmcache devices``.
DEVICE_OP_NAMES: tuple[str, ...] = tuple(
    name
    for name, value in vars(DeviceOps).items()
    if not name.startswith("_")
    and (isinstance(value, _BaselineOp) or (callable(value) and not isinstance(value, type)))
    and name not in {"ensure_native", "bind_native"}
)

__all__ = ["DEVICE_OP_NAMES", "DeviceOps", "ops_types"]
