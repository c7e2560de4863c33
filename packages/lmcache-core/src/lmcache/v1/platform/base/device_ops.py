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
import types
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from lmcache.v1.platform import ops_types, torch_ops
from lmcache.v1.platform.ops_types import (
    BatchStep,
    EngineKVFormat,
    KernelGroupSpec,
    LaunchVar,
    PageBufferShapeDesc,
    StagingCopy,
    TransferDirection,
    TransferPhase,
)

logger = logging.getLogger(__name__)


def _delegate_to_baseline(name: str) -> Callable[..., Any]:
    """A method calling the ``torch_ops`` op ``name``, with that op's exact signature.

    The baseline function is the op's only declaration: its parameters, defaults and
    documentation are the method's (plus a positional-only ``self``).
    """
    declaration = getattr(torch_ops, name)

    @functools.wraps(declaration)
    def method(self: DeviceOps, *args: Any, **kwargs: Any) -> Any:
        return getattr(torch_ops, name)(*args, **kwargs)

    signature = inspect.signature(declaration)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    method.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_param, *signature.parameters.values()]
    )
    method.__module__ = __name__
    method.__qualname__ = f"DeviceOps.{name}"
    return method


class DeviceOps:
    """Strategy object for one device; ``lmcache.device_ops`` is the selected backend's."""

    device_type: ClassVar[str] = ""

    # Types callers construct through the ops object so native overlays take effect.
    TransferDirection: Any = TransferDirection
    EngineKVFormat: Any = EngineKVFormat
    GPUKVFormat: Any = EngineKVFormat
    TransferPhase: Any = TransferPhase
    PageBufferShapeDesc: Any = PageBufferShapeDesc
    KernelGroupSpec: Any = KernelGroupSpec
    StagingCopy: Any = StagingCopy
    LaunchVar: Any = LaunchVar
    BatchStep: Any = BatchStep

    def __init__(self) -> None:
        self._native_bound = False
        self._native_module_name: str | None = None
        self._native_symbols: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that do not exist: lets hasattr() detect optional
        # native-only ops without a try/except at every call site.
        raise AttributeError(f"{type(self).__name__} has no device operation {name!r}")

    # -- native binding -----------------------------------------------------------------
    def ensure_native(self) -> None:
        """Bind native ops; the base keeps the torch baseline for everything."""
        return None

    def bind_native(self, module: types.ModuleType | Any) -> None:
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
        return torch_ops.alloc_pinned_ptr(size, device_id)

    def free_pinned_ptr(self, ptr: int) -> None:
        torch_ops.free_pinned_ptr(ptr)

    def alloc_pinned_numa_ptr(self, size: int, numa_id: int = 0) -> int:
        return torch_ops.alloc_pinned_numa_ptr(size, numa_id)

    def free_pinned_numa_ptr(self, ptr: int, size: int | None = None) -> None:
        torch_ops.free_pinned_numa_ptr(ptr, size)

    def alloc_numa_ptr(self, size: int, numa_id: int = 0) -> int:
        return torch_ops.alloc_numa_ptr(size, numa_id)

    def free_numa_ptr(self, ptr: int, size: int | None = None) -> None:
        torch_ops.free_numa_ptr(ptr, size)

    def alloc_shm_pinned_ptr(self, size: int, shm_name: str = "") -> int:
        return torch_ops.alloc_shm_pinned_ptr(size, shm_name)

    def free_shm_pinned_ptr(self, ptr: int, size: int = 0, shm_name: str = "") -> None:
        torch_ops.free_shm_pinned_ptr(ptr, size, shm_name)

    def alloc_hugepage_pinned_ptr(self, size: int, device_id: int = 0) -> int:
        return torch_ops.alloc_hugepage_pinned_ptr(size, device_id)

    def free_hugepage_pinned_ptr(self, ptr: int, size: int = 0) -> None:
        torch_ops.free_hugepage_pinned_ptr(ptr, size)

    def alloc_hugepage_pinned_numa_ptr(self, size: int, numa_id: int = 0) -> int:
        return torch_ops.alloc_hugepage_pinned_numa_ptr(size, numa_id)

    def free_hugepage_pinned_numa_ptr(self, ptr: int, size: int = 0) -> None:
        torch_ops.free_hugepage_pinned_numa_ptr(ptr, size)

    def batched_memcpy(self, src_ptrs: list[int], dst_ptrs: list[int], sizes: list[int]) -> None:
        torch_ops.batched_memcpy(src_ptrs, dst_ptrs, sizes)

    def tensor_from_ptr(
        self, ptr: int, shape: Sequence[int], dtype: torch.dtype, device: Any = None
    ) -> torch.Tensor:
        return torch_ops.tensor_from_ptr(ptr, shape, dtype, device)

    # -- KV transfer: declared by the torch_ops functions (see _delegate_to_baseline) ----
    multi_layer_block_kv_transfer = _delegate_to_baseline("multi_layer_block_kv_transfer")
    multi_layer_kv_transfer = _delegate_to_baseline("multi_layer_kv_transfer")
    multi_layer_kv_transfer_unilateral = _delegate_to_baseline("multi_layer_kv_transfer_unilateral")
    single_layer_kv_transfer = _delegate_to_baseline("single_layer_kv_transfer")
    single_layer_kv_transfer_sgl = _delegate_to_baseline("single_layer_kv_transfer_sgl")
    load_and_reshape_flash = _delegate_to_baseline("load_and_reshape_flash")
    reshape_and_cache_back_flash = _delegate_to_baseline("reshape_and_cache_back_flash")
    # Positional only, like the native binding, which declares no argument names.
    lmcache_memcpy_async = _delegate_to_baseline("lmcache_memcpy_async")

    # -- CacheGen codec -----------------------------------------------------------------
    def calculate_cdf(self, input_tensor: torch.Tensor, num_bins: int) -> torch.Tensor:
        return torch_ops.calculate_cdf(input_tensor, num_bins)

    def encode_fast_new(
        self,
        cdf: torch.Tensor,
        input_sym: torch.Tensor,
        output_buffer: torch.Tensor,
        output_lengths: torch.Tensor,
    ) -> Any:
        return torch_ops.encode_fast_new(cdf, input_sym, output_buffer, output_lengths)

    def decode_fast_new(
        self,
        cdf: torch.Tensor,
        bytestreams: torch.Tensor,
        lengths: torch.Tensor,
        output: torch.Tensor,
    ) -> Any:
        return torch_ops.decode_fast_new(cdf, bytestreams, lengths, output)

    def decode_fast_prefsum(
        self,
        cdf: torch.Tensor,
        bytestreams: torch.Tensor,
        lengths_prefsum: torch.Tensor,
        output: torch.Tensor,
    ) -> Any:
        return torch_ops.decode_fast_prefsum(cdf, bytestreams, lengths_prefsum, output)

    # -- stream-ordered recording -------------------------------------------------------
    def record_event_on_stream(self, *args: Any) -> None:
        torch_ops.record_event_on_stream(*args)

    def drain_recorded_events(self) -> list[tuple[str, str, float, dict, dict]]:
        return torch_ops.drain_recorded_events()

    def record_completion_on_stream(self, *args: Any) -> None:
        torch_ops.record_completion_on_stream(*args)

    def drain_recorded_completions(self) -> list[tuple[str, bytes]]:
        return torch_ops.drain_recorded_completions()

    # -- positional encoding ------------------------------------------------------------
    def rotary_embedding_k_fused(self, *args: Any) -> None:
        torch_ops.rotary_embedding_k_fused(*args)

    def rotary_embedding_k_fused_strided(self, *args: Any) -> None:
        torch_ops.rotary_embedding_k_fused_strided(*args)

    # -- misc ---------------------------------------------------------------------------
    def get_gpu_pci_bus_id(self, device_id: int = 0) -> str | None:
        return torch_ops.get_gpu_pci_bus_id(device_id)


# Names of every op method, for conformance tests and ``lmcache devices``.
DEVICE_OP_NAMES: tuple[str, ...] = tuple(
    name
    for name, value in vars(DeviceOps).items()
    if not name.startswith("_")
    and callable(value)
    and not isinstance(value, type)
    and name not in {"ensure_native", "bind_native"}
)

__all__ = ["DEVICE_OP_NAMES", "DeviceOps", "ops_types"]
