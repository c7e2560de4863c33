"""Run upstream LMCache 0.5.6's own unit tests against the installed ``lmcache`` (ours).

Usage::

    python tests_interop/upstream_unit/run.py --sdist lmcache-0.5.6.tar.gz [--strict]

The selected upstream test files (``SELECTED``) are copied out of the sdist into a
temporary folder and run with pytest in a child process of this interpreter, so the
``lmcache`` that interpreter imports (the installed lmcache-core wheel under nox, or a
source tree via ``PYTHONPATH``) is the one under test.  Under nox the lmcache-cuda plugin
wheel is installed beside it, so upstream's ``devices.cuda`` import paths resolve to the
plugin's classes; without the plugin the files that need it (``CUDA_PLUGIN_FILES``) are
left out and the summary line says so.  Upstream's package-level
``tests/conftest.py`` is left out: it builds upstream's in-process ``LMCacheEngine``, which
lmcache-core does not ship, and none of the selected files uses its fixtures.

Nothing is skipped silently: every file not run (``IGNORED``) and every test deselected
(``DESELECTED``) is listed here with its reason, and the same ids are listed in
``docs/compatibility.md`` (``tests/test_upstream_unit_lists.py`` checks that the two agree).

Printed at the end: collected / passed / failed / skipped / errors, and the number of test
files that imported.  With ``--strict`` the exit status is 1 when any test that is run
fails or errors (collection errors included).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

UPSTREAM_VERSION = "0.5.6"
SDIST_NAME = f"lmcache-{UPSTREAM_VERSION}.tar.gz"
# sha256 of the published sdist (PyPI), checked before anything is extracted.
SDIST_SHA256 = "d6951e60ce8818a76aa42d0866a4ba85f1c95cd919355fff30ff24dcc3243f1e"

# What issue 18 measures: these upstream test paths (relative to the sdist's root).
SELECTED = (
    "tests/v1/platform",
    "tests/v1/multiprocess",
    "tests/v1/lmcache_native",
    "tests/v1/test_torch_ops.py",
    "tests/v1/test_memory_management.py",
    # Upstream API this project also provides (session 6).
    "tests/v1/gpu_connector",
    "tests/v1/plugin",
    "tests/v1/test_periodic_thread.py",
    "tests/v1/test_json_utils.py",
    # Eviction policies and tenant quotas (issue 30): product policies behind upstream's
    # lmcache.v1.distributed.eviction_policy names, the product QuotaManager.
    "tests/v1/distributed/test_lru_eviction_policy.py",
    "tests/v1/distributed/test_isolated_lru_eviction_policy.py",
    "tests/v1/distributed/test_quota_manager.py",
    "tests/v1/distributed/test_arc_eviction_policy.py",
    "tests/v1/distributed/test_cache_salt_l2_eviction.py",
    # The L2 adapter interface (issue #30).
    "tests/v1/distributed/test_l2_adapter_base.py",
    "tests/v1/distributed/test_mock_l2_adapter.py",
    "tests/v1/distributed/test_fault_inject_l2_adapter.py",
    # L2 serde (issue 30).
    "tests/v1/distributed/serde",
)
# Files copied along so the selected tests import as upstream lays them out.
SUPPORT_FILES = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    # The package guard (lmcache_native's Bitmap and PeriodicEventNotifier) and the
    # conftest (a Bitmap fallback and the Valkey options) of tests/v1/distributed.
    "tests/v1/distributed/__init__.py",
    "tests/v1/distributed/conftest.py",
)

# Test files or folders not run at all: path -> reason.  Keep in step with
# docs/compatibility.md.
_NO_SUCH_BACKEND = (
    "vendor backend that upstream ships inside its core and this project ships neither in "
    "lmcache-core nor as a plugin wheel"
)
# The session installs the lmcache-cuda plugin wheel beside the core wheel, so upstream's
# ``devices.cuda`` names resolve to its classes; these files need names it does not have.
_CUDA_PLUGIN_LACKS = (
    "imports, at module level, upstream CUDA names that the lmcache-cuda plugin wheel "
    "(installed in this session) does not provide: "
)
# tests/v1/multiprocess: upstream's guard passes now that lmcache_native has Bitmap and
# PeriodicEventNotifier, so each file that cannot import is listed with what it lacks
# (found by importing every ``lmcache`` name the file imports; upstream's helper modules
# in the same folder are left out of the lists, they fail for the same reasons).
_MP_INTERNALS = (
    "imports upstream modules or names that are missing here, mostly MP-server internals "
    "that lmcache-core's server (lmcache.v1.multiprocess.server) replaces rather than "
    "mirrors: "
)


_L2_OWN_TIER = (
    "types fs, resp and valkey are served here by lmcache-core's own disk and Redis tiers, "
    "not by adapters of upstream's L2 adapter interface (no facade over those tiers in that "
    "interface yet), so this file cannot import upstream's "
)


def _needs(*names: str) -> str:
    return _MP_INTERNALS + ", ".join(names)


IGNORED: dict[str, str] = {
    "tests/v1/platform/devices/musa": _NO_SUCH_BACKEND + " (MUSA); includes checks of "
    "upstream's own MUSA wheel CI scripts",
    "tests/v1/platform/devices/npu": _NO_SUCH_BACKEND + " (Ascend NPU)",
    "tests/v1/platform/devices/rbln": _NO_SUCH_BACKEND + " (Rebellions RBLN)",
    "tests/v1/platform/devices/neuron": _NO_SUCH_BACKEND + " (AWS Neuron)",
    "tests/v1/platform/devices/xpu": _NO_SUCH_BACKEND + " (Intel XPU)",
    "tests/v1/platform/devices/cuda/test_cuda_ipc_wrapper.py": _CUDA_PLUGIN_LACKS
    + "RawCudaIPCWrapper (upstream's cuda.bindings wrapper for isolated IPC; lmcache-cuda "
    "shares memory through torch's CUDA IPC handles only); every test in it needs a CUDA "
    "device",
    "tests/v1/platform/devices/cuda/test_timeline_semaphore_event_ipc.py": _CUDA_PLUGIN_LACKS
    + "devices.cuda.timeline_semaphore_event_ipc and devices.cuda.utils (upstream's "
    "timeline-semaphore event IPC over cuda.bindings); every test in it needs a CUDA device",
    "tests/v1/platform/devices/cuda/test_vmm_ipc_wrapper.py": "upstream's CUDA VMM IPC "
    "wrapper; neither lmcache-core nor lmcache-cuda supports VMM-allocated KV caches",
    "tests/v1/platform/devices/cuda/test_gpu_cache_context.py": "upstream's GPUCacheContext "
    "over its KV-layer-group manager (lmcache.v1.kv_layer_groups, not shipped); ours is "
    "lmcache-cuda's CudaCacheContext with its own suite",
    "tests/v1/platform/test_device_plugins.py": "imports, at module level, upstream's "
    "in-tree-devices discovery helper (lmcache.v1.utils.subclass_discovery), which our "
    "entry-point registry replaces, and drives it",
    "tests/v1/platform/test_event_ipc.py": _CUDA_PLUGIN_LACKS
    + "devices.cuda.timeline_semaphore_event_ipc (upstream's timeline-semaphore event IPC)",
    "tests/v1/platform/test_stream.py": "imports MusaDeviceSpec (a backend not shipped) at "
    "module level; lmcache.v1.platform.stream itself is provided and tested in "
    "tests/v1/platform/test_stream.py",
    "tests/v1/platform/test_ipc_wire.py": "its module imports upstream's gRPC transport "
    "(lmcache.v1.multiprocess.transport.grpc_impl); the MP server here speaks ZMQ only",
    "tests/v1/multiprocess/http_apis/test_cache_api.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.multiprocess.cache_control",
        "lmcache.v1.multiprocess.http_apis.error_handlers",
    ),
    "tests/v1/multiprocess/http_apis/test_l1_reconfigure_api.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.memory_allocators",
        "lmcache.v1.multiprocess.http_apis.l1_reconfigure_api",
    ),
    "tests/v1/multiprocess/http_apis/test_reconfigure_api.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.memory_allocators",
        "lmcache.v1.mp_coordinator",
        "lmcache.v1.multiprocess.http_apis.l1_reconfigure_api",
        "lmcache.v1.multiprocess.http_apis.reconfigure_api",
    ),
    "tests/v1/multiprocess/test_blend_matcher.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.multiprocess.modules.blend.matcher",
        "lmcache.v1.multiprocess.custom_types.CBMatchResult",
    ),
    "tests/v1/multiprocess/test_blend_observability.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.mp_coordinator",
        "lmcache.v1.mp_observability",
        "lmcache.v1.multiprocess.modules.blend.lookup",
        "lmcache.v1.multiprocess.modules.blend.matcher",
        "lmcache.v1.multiprocess.modules.blend.module",
        "lmcache.v1.multiprocess.modules.blend.read_set",
        "lmcache.v1.multiprocess.modules.blend.retrieve",
        "lmcache.v1.multiprocess.custom_types.CBMatchResult",
    ),
    "tests/v1/multiprocess/test_blend_retrieve.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.kv_layer_groups",
        "lmcache.v1.memory_allocators",
        "lmcache.v1.multiprocess.modules.blend.module",
        "lmcache.v1.multiprocess.modules.blend.retrieve",
        "lmcache.v1.multiprocess.custom_types.CBMatchResult",
    ),
    "tests/v1/multiprocess/test_blend_store.py": _needs(
        "lmcache.v1.mp_coordinator",
        "lmcache.v1.multiprocess.modules.blend.module",
        "lmcache.v1.multiprocess.modules.blend.read_set",
        "lmcache.v1.multiprocess.modules.blend.retrieve",
        "lmcache.v1.multiprocess.custom_types.CBMatchResult",
    ),
    "tests/v1/multiprocess/test_cache_server.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.mp_observability",
        "lmcache.v1.multiprocess.server.run_cache_server",
        "lmcache.v1.multiprocess.transport",
    ),
    "tests/v1/multiprocess/test_client.py": _needs(
        "lmcache.v1.multiprocess.protocols",
        "lmcache.v1.multiprocess.rpc",
        "lmcache.v1.multiprocess.transport",
    ),
    "tests/v1/multiprocess/test_direct_transfer_dispatch.py": _needs(
        "lmcache.v1.kv_layer_groups",
        "lmcache.v1.multiprocess.object_group_transfer.direct_transfer_supported",
        "lmcache.v1.memory_management.GDSMemoryObject",
    ),
    "tests/v1/multiprocess/test_engine_driven_transfer.py": _needs(
        "lmcache.integration.vllm.vllm_multi_process_adapter",
        "lmcache.v1.distributed",
        "lmcache.v1.multiprocess.engine_context",
        "lmcache.v1.multiprocess.modules.engine_driven_transfer",
        "lmcache.v1.multiprocess.transfer_context.base.create_engine_driven_context",
        "lmcache.v1.multiprocess.transfer_context.pickle",
        "lmcache.v1.multiprocess.transfer_context.shm",
        "lmcache.v1.platform.devices.musa",
        "lmcache.v1.platform.devices.npu",
    ),
    "tests/v1/multiprocess/test_engine_passthroughs.py": _needs(
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer",
        "lmcache.v1.multiprocess.modules.management",
    ),
    "tests/v1/multiprocess/test_event_ipc_handle_path.py": _needs(
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer"
    ),
    "tests/v1/multiprocess/test_ext_server_module.py": _needs(
        "lmcache.v1.multiprocess.ext_server_module",
        "lmcache.v1.multiprocess.protocols",
        "lmcache.v1.multiprocess.request_handler",
    ),
    "tests/v1/multiprocess/test_free_locks.py": _needs(
        "lmcache.integration.vllm.vllm_multi_process_adapter",
        "lmcache.v1.distributed",
        "lmcache.v1.mp_observability",
        "lmcache.v1.multiprocess.modules.lookup",
        "lmcache.v1.multiprocess.request_handler",
        "lmcache.v1.multiprocess.rpc",
        "lmcache.v1.multiprocess.transport",
    ),
    "tests/v1/multiprocess/test_grpc_transport.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.multiprocess.ext_server_module",
        "lmcache.v1.multiprocess.modules.engine_driven_transfer",
        "lmcache.v1.multiprocess.modules.experimental",
        "lmcache.v1.multiprocess.modules.kv_events",
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer",
        "lmcache.v1.multiprocess.modules.lookup",
        "lmcache.v1.multiprocess.modules.management",
        "lmcache.v1.multiprocess.modules.p2p_controller",
        "lmcache.v1.multiprocess.protocols",
        "lmcache.v1.multiprocess.request_handler",
        "lmcache.v1.multiprocess.transport",
        "lmcache.v1.multiprocess.custom_types.CBMatchResult",
        "lmcache.v1.multiprocess.custom_types.CBUnifiedLookupResult",
        "lmcache.v1.multiprocess.modules.blend.BlendModule",
    ),
    "tests/v1/multiprocess/test_http_quota_endpoints.py": _needs(
        "lmcache.v1.multiprocess.http_server.app (upstream's module-level FastAPI app; the "
        "same /quota routes are lmcache server's, tests/v1/multiprocess/server/"
        "operator_routes/test_quota_api.py)"
    ),
    "tests/v1/multiprocess/test_http_server.py": _needs(
        "lmcache.v1.mp_coordinator",
        "lmcache.v1.mp_observability",
        "lmcache.v1.multiprocess.http_server.app",
        "lmcache.v1.multiprocess.config.HTTPFrontendConfig",
    ),
    "tests/v1/multiprocess/test_ipc_memory_reclaim.py": _needs(
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer"
    ),
    "tests/v1/multiprocess/test_key_resolver.py": _needs(
        "lmcache.v1.distributed", "lmcache.v1.multiprocess.cache_control"
    ),
    "tests/v1/multiprocess/test_l1_owner_completion.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.kv_layer_groups",
        "lmcache.v1.mp_observability",
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer",
    ),
    "tests/v1/multiprocess/test_lmcache_driven_missing_registration.py": _needs(
        "lmcache.v1.distributed", "lmcache.v1.multiprocess.modules.lmcache_driven_transfer"
    ),
    "tests/v1/multiprocess/test_lmcache_driven_transfer_skip.py": _needs(
        "lmcache.v1.kv_layer_groups",
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer",
        "lmcache.v1.multiprocess.object_group_transfer.downsample_and_stage_block_ids",
    ),
    "tests/v1/multiprocess/test_lookup_outcome_attribution.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.mp_observability",
        "lmcache.v1.multiprocess.modules.lookup",
    ),
    "tests/v1/multiprocess/test_lookup_wait_prefetch.py": _needs(
        "lmcache.v1.distributed", "lmcache.v1.multiprocess.modules.lookup"
    ),
    "tests/v1/multiprocess/test_mq.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.multiprocess.request_handler",
        "lmcache.v1.multiprocess.transport",
    ),
    "tests/v1/multiprocess/test_native_state_alias_gpu.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.mp_observability",
        "lmcache.v1.multiprocess.server.run_cache_server",
        "lmcache.v1.multiprocess.transport",
    ),
    "tests/v1/multiprocess/test_native_state_lookup.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.kv_layer_groups",
        "lmcache.v1.multiprocess.engine_context",
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer",
        "lmcache.v1.multiprocess.modules.lookup",
    ),
    "tests/v1/multiprocess/test_p2p_controller.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.multiprocess.modules.p2p_controller",
        "lmcache.v1.multiprocess.rpc",
        "lmcache.v1.multiprocess.transport",
    ),
    "tests/v1/multiprocess/test_prefetch_service.py": _needs(
        "lmcache.v1.distributed", "lmcache.v1.multiprocess.cache_control"
    ),
    "tests/v1/multiprocess/test_protocols.py": _needs(
        "lmcache.v1.multiprocess.rpc", "lmcache.v1.multiprocess.transport"
    ),
    "tests/v1/multiprocess/test_qstore.py": _needs(
        "lmcache.v1.multiprocess.modules.experimental",
        "lmcache.v1.multiprocess.modules.kv_events",
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer",
    ),
    "tests/v1/multiprocess/test_query_lookup_hits.py": _needs(
        "lmcache.v1.distributed", "lmcache.v1.multiprocess.modules.lookup"
    ),
    "tests/v1/multiprocess/test_raw_block_l2_adapter.py": _needs(
        "lmcache.v1.distributed", "lmcache.v1.storage_backend.raw_block"
    ),
    "tests/v1/multiprocess/test_request_server.py": _needs(
        "lmcache.v1.multiprocess.engine_context",
        "lmcache.v1.multiprocess.engine_module",
        "lmcache.v1.multiprocess.request_handler",
        "lmcache.v1.multiprocess.transport",
    ),
    "tests/v1/multiprocess/test_transport_factory.py": _needs(
        "lmcache.v1.multiprocess.engine_module", "lmcache.v1.multiprocess.transport"
    ),
    "tests/v1/multiprocess/test_unified_touch.py": _needs("lmcache.v1.distributed"),
    "tests/v1/multiprocess/test_usage_telemetry_server.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.mp_observability",
        "lmcache.v1.multiprocess.server.run_cache_server",
    ),
    "tests/v1/multiprocess/test_warm_prefetch.py": _needs(
        "lmcache.v1.distributed", "lmcache.v1.multiprocess.warm_prefetch"
    ),
    "tests/v1/multiprocess/test_worker_liveness.py": _needs(
        "lmcache.v1.distributed",
        "lmcache.v1.mp_observability",
        "lmcache.v1.multiprocess.modules.engine_driven_transfer",
        "lmcache.v1.multiprocess.modules.kv_events",
        "lmcache.v1.multiprocess.modules.lmcache_driven_transfer",
        "lmcache.v1.multiprocess.modules.management",
        "lmcache.v1.multiprocess.transport",
        "lmcache.v1.multiprocess.modules.blend.BlendModule",
    ),
    "tests/v1/distributed/test_cache_salt_l2_eviction.py": _needs(
        "lmcache.v1.distributed.storage_controllers.eviction_controller (upstream's periodic "
        "L2 eviction controller; our tiers evict by quota when they need room, "
        "tests/v1/storage_backend/test_eviction_policies.py)",
    ),
    "tests/v1/gpu_connector/gds_backends": "upstream's GPUDirect Storage file backends "
    "(cuFile, hipFile, ...), which neither lmcache-core nor a plugin wheel ships",
    "tests/v1/gpu_connector/test_gds_context.py": "upstream's GPUDirect Storage context "
    "over lmcache.v1.distributed (not shipped)",
    "tests/v1/gpu_connector/test_per_layer_kv_tuple_format.py": "imports upstream's "
    "KV-layer-group manager (lmcache.v1.kv_layer_groups), which lmcache-core does not ship",
    "tests/v1/distributed/test_l2_adapter_factory.py": "imports, at module level, upstream's "
    "raw_block_l2_adapter (a raw block device adapter over its Rust I/O extension), an "
    "adapter type refused here; the factory, plugin and mock registrations it covers are "
    "tested in tests/v1/storage_backend/l2_adapters/test_adapter_types.py",
    **{
        f"tests/v1/distributed/{name}": _L2_OWN_TIER + reason
        for name, reason in (
            ("test_fs_l2_adapter_keys.py", "fs_l2_adapter (FSL2Adapter)"),
            ("test_fs_l2_adapter_delete.py", "fs_l2_adapter (FSL2Adapter)"),
            ("test_resp_env_vars.py", "resp_l2_adapter (RESPL2AdapterConfig)"),
            ("test_resp_l2_adapter_integration.py", "resp_l2_adapter and its C++ client"),
            ("test_valkey_l2_adapter.py", "valkey_l2_adapter (ValkeyL2Adapter)"),
            ("test_valkey_l2_adapter_integration.py", "valkey_l2_adapter (ValkeyL2Adapter)"),
        )
    },
    "tests/v1/distributed/serde/test_serde_e2e.py": "drives upstream's MP storage manager "
    "(lmcache.v1.distributed.storage_manager, its controllers and L1 manager) with a serde; "
    "here serde runs in the tiers of the one storage stack (SerdeBackend), tested end to end "
    "in tests/v1/storage_backend/serde/test_serde_backend.py",
    "tests/v1/distributed/serde/test_serde_fs_e2e.py": "drives upstream's MP storage manager "
    "(lmcache.v1.distributed.storage_manager) over its fs adapter with a serde; the disk "
    "tier with a serde is tested in tests/v1/storage_backend/serde/test_serde_backend.py",
    "tests/v1/distributed/serde/test_turboquant.py": "upstream's turboquant serde (its "
    "Triton kernels and lmcache.v1.distributed.config) is not provided",
}

# Tests deselected one by one (pytest node ids): id -> reason.  Keep in step with
# docs/compatibility.md.
_CPU_SHM = "tests/v1/platform/devices/cpu/test_cpu_shm.py::"
_SCENARIO = "tests/v1/test_torch_ops.py::TestScenarios::"
_MP = "tests/v1/multiprocess/"
_CUDA_MARKED = (
    "GPU-only: marked cuda by upstream, whose CPU torch_dev is a stub reporting unavailable "
    "(so upstream's own skip mark skips it); ours is torch.cpu, which reports available but "
    "has no init(); tests/v1/multiprocess/test_futures_compat.py runs the same check "
    "(a DeviceMessagingFuture importing an event another process exported) on the host "
    "event backend"
)
_LAYOUT_REGISTRY = (
    "imports, inside the test, upstream's LayoutDescRegistry "
    "(lmcache.v1.multiprocess.engine_context) and lmcache.v1.distributed.api, MP-server "
    "internals that lmcache-core's server replaces rather than mirrors"
)
_DEVICE_OPS = "tests/v1/platform/test_device_ops.py::"
_PRIVATE_TABLES = (
    "snapshots and monkeypatches upstream's private module-level backend tables "
    "(lmcache.v1.platform._DEVICE_REGISTRY, _DEVICE_TYPE_REGISTRY); our backends live in "
    "the registry object (lmcache.v1.platform.registry.get_registry())"
)
DESELECTED: dict[str, str] = {
    "tests/v1/gpu_connector/test_blocks_first_cs_kv_format.py::"
    "test_mp_gather_scatter_roundtrip": "expects upstream's chunk shape for the fused "
    "blocks-first layout [NB, NH, BS, 2*HS], one fused plane [NL, T, NH*2*HS]; our "
    "engine-driven chunks are K/V-major [2, NL, T, NH*HS] for every non-MLA layout (the "
    "round trip is exact), so such chunks are not byte-compatible with upstream's workers",
    _CPU_SHM + "test_wrap_kv_caches_unlinks_partial_batch_on_failure": "wraps plain "
    "(non-SHM) tensors through kv_wrap, which upstream migrates implicitly; ours refuses "
    "them with a ValueError naming migrate_to_shm_and_wrap",
    _CPU_SHM + "test_migrate_ignores_stale_entry_from_id_reuse": "needs upstream's private "
    "test hook inject_stale_cache_entry_for_test into an id-keyed segment cache, which ours "
    "does not have: the migration mark lives on the storage object itself and dies with it, "
    "so no stale entry can outlive its storage",
    "tests/v1/platform/devices/cuda/test_cuda_tensor_from_ptr.py": "monkeypatches module "
    "globals (torch, its CUDA-array-interface helpers) of upstream's in-core CUDA device_ops "
    "module; here that path only forwards CudaDeviceOps to the lmcache-cuda plugin, whose "
    "ops build device tensors their own way",
    **{
        _DEVICE_OPS + name: _PRIVATE_TABLES
        for name in (
            "test_every_registered_device_has_all_ops",
            "test_cpu_without_registered_spec_falls_back_to_base_device_ops",
            "test_unregistered_accelerator_fails_fast",
            "test_new_device_needs_zero_resolver_edits",
        )
    },
    _DEVICE_OPS + "test_cpu_overrides_pointer_construction_only": (
        "expects CpuDeviceOps to override tensor_from_ptr; our baseline "
        "DeviceOps.tensor_from_ptr already builds host tensors, so CpuDeviceOps overrides no op"
    ),
    _DEVICE_OPS + "test_cuda_device_ops_loads_cuda_ops": (
        "expects CudaDeviceOps to bind upstream's in-core native module lmcache.cuda_ops; "
        "lmcache-cuda's CudaDeviceOps binds its own extension (lmcache_cuda.native_ops)"
    ),
    _DEVICE_OPS + "test_package_exports_resolved_device_ops": (
        "expects the native-only type names (TransferDirection, EngineKVFormat, is_mla, ...) "
        "to be absent from the CPU ops singleton; our DeviceOps always carries their "
        "torch-free Python versions (lmcache.v1.platform.ops_types)"
    ),
    _DEVICE_OPS + "test_cpu_and_empty_string_resolve_to_expected_ops_classes": (
        "expects resolve_device_ops('') to return the bare DeviceOps baseline; ours refuses "
        "a device type no backend registers, '' included (a RuntimeError naming the "
        "registered types)"
    ),
    "tests/v1/platform/test_cache_context_dispatch.py::test_dispatches_by_cpu_device_type": (
        "its fake context implements only upstream's abstract methods; our BaseCacheContext "
        "also requires layout, get_shape_desc and transfer_blocks (the server's block path)"
    ),
    "tests/v1/platform/test_cache_context_dispatch.py::test_dispatches_by_cuda_device_type": (
        "same fake context as test_dispatches_by_cpu_device_type (on CPU it routes to cpu)"
    ),
    "tests/v1/platform/test_cache_context_dispatch.py::test_mixed_device_types_raises": (
        "same fake context as test_dispatches_by_cpu_device_type"
    ),
    "tests/v1/platform/test_ipc_policy.py::test_vmm_wrapper_selection_follows_policy_only": (
        "needs upstream's VmmCudaIPCWrapper and RocmDeviceSpec; VMM KV caches are not "
        "supported here"
    ),
    _SCENARIO + "test_1_scenario[cpu_py_ops-record_drain_event-scenario_record_drain_event]": (
        "stops upstream's observability event bus (lmcache.v1.mp_observability), which "
        "lmcache-core does not ship"
    ),
    _SCENARIO + "test_2_compare[record_drain_event]": "compares the results of the scenario above",
    _MP + "test_autostart_health.py::test_autostart_health_real_transport[True]": (
        "its subprocess imports upstream's lmcache.integration.vllm.mp_server_launcher and "
        "its ZMQ MessageQueueServer (lmcache.v1.multiprocess.transport, request_handler), "
        "server internals replaced here; our connector's server autostart is "
        "lmcache.integration.vllm.autostart, with its own tests"
    ),
    _MP + "test_autostart_health.py::test_autostart_health_real_transport[False]": (
        "same subprocess as test_autostart_health_real_transport[True]"
    ),
    **{
        _MP + "test_futures.py::" + name: _CUDA_MARKED
        for name in (
            "test_cuda_messaging_future_basic_usage",
            "test_cuda_messaging_future_with_thread",
            "test_cuda_messaging_future_wait_no_timeout",
            "test_cuda_messaging_future_wait_with_timeout_success",
            "test_cuda_messaging_future_result_with_timeout_success",
            "test_cuda_messaging_future_multiple_result_calls",
            "test_cuda_messaging_future_query_before_and_after",
            "test_cuda_messaging_future_complex_type",
            "test_messaging_future_to_device_future",
            "test_cuda_messaging_future_with_explicit_device",
            "test_cuda_messaging_future_wait_timeout_reached",
            "test_cuda_messaging_future_result_timeout_reached",
            "test_device_future_empty_handle_is_terminal_without_event_import",
        )
    },
    **{
        _MP + "test_lmcache_driven_layout_registry.py::" + name: _LAYOUT_REGISTRY
        for name in (
            "test_unregister_one_shared_gpu_layout_keeps_registry_until_last_instance",
            "test_registry_attn_desc_roundtrip",
            "test_registry_derives_group_layout_descs_when_not_given",
            "test_registry_attn_desc_raises_when_unregistered",
            "test_registry_windows_default_single_group_when_omitted",
            "test_registry_windows_updated_on_reregister",
        )
    },
    _MP + "transport/test_proto_generator.py::"
    "test_generated_import_check_does_not_import_lmcache_root": (
        "loads upstream's gRPC stub generator (lmcache/v1/multiprocess/transport/grpc_impl/"
        "_proto_gen/_generate.py) from upstream's source tree, which is not copied (the "
        "package under test is ours); the MP server here speaks ZMQ only"
    ),
}

# Files that import upstream's ``devices.cuda`` names at module level and run only with the
# lmcache-cuda plugin wheel installed (the nox session installs it).  Run where the plugin
# is absent (a core-only venv), they are left out and the summary says how many.
CUDA_PLUGIN_PACKAGE = "lmcache_cuda"
CUDA_PLUGIN_FILES = (
    "tests/v1/platform/test_device_ops.py",
    "tests/v1/platform/devices/rocm/test_rocm_pin_memory.py",
)

# Per-test limit: an upstream test that hangs against our code is a failure, not a stall.
TEST_TIMEOUT_S = 120


@dataclass
class Counts:
    collected: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    files_total: int = 0
    files_importing: int = 0
    files_skipped: int = 0
    files_without_plugin: int = 0
    broken_files: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"upstream {UPSTREAM_VERSION} unit tests: files {self.files_importing}/"
            f"{self.files_total} import ({self.files_skipped} of them skipped whole by "
            f"their own guard); collected {self.collected}, passed {self.passed}, "
            f"failed {self.failed}, skipped {self.skipped}, errors {self.errors}; "
            f"deselected by {len(DESELECTED)} ids, {len(IGNORED)} files/folders not run"
            + (
                f"; lmcache-cuda NOT installed: {self.files_without_plugin} more files not run"
                if self.files_without_plugin
                else ""
            )
        )


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _is_selected(relative: PurePosixPath) -> bool:
    text = relative.as_posix()
    if text in SUPPORT_FILES or text == "pytest.ini":
        return True
    return any(text == sel or text.startswith(sel + "/") for sel in SELECTED)


def extract_tests(sdist: Path, dest: Path) -> None:
    """Copy the selected test files (and upstream's pytest.ini, for its markers) to ``dest``."""
    actual = _sha256(sdist)
    if actual != SDIST_SHA256:
        raise SystemExit(f"{sdist}: sha256 {actual} is not the published {SDIST_NAME}")
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive.getmembers():
            parts = PurePosixPath(member.name).parts
            if len(parts) < 2 or not member.isfile():
                continue
            relative = PurePosixPath(*parts[1:])  # drop the "lmcache-0.5.6/" prefix
            if not _is_selected(relative):
                continue
            source = archive.extractfile(member)
            assert source is not None
            target = dest / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read())


def _test_files(root: Path) -> list[str]:
    files: list[str] = []
    for sel in SELECTED:
        path = root / sel
        candidates = [path] if path.is_file() else sorted(path.rglob("test_*.py"))
        files.extend(p.relative_to(root).as_posix() for p in candidates)
    return files


def _left_out(plugin_installed: bool) -> list[str]:
    """The files and folders not run: ``IGNORED``, and the plugin's files without it."""
    return [*IGNORED, *(() if plugin_installed else CUDA_PLUGIN_FILES)]


def _pytest_args(root: Path, junit: Path, extra: list[str], left_out: list[str]) -> list[str]:
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        str(root / "pytest.ini"),
        "--rootdir",
        str(root),
        "-p",
        "no:cacheprovider",
        "-o",
        "log_cli=false",
        "-q",
        "-rfE",
        "--continue-on-collection-errors",
        f"--timeout={TEST_TIMEOUT_S}",
        f"--junitxml={junit}",
    ]
    for path in left_out:
        args += ["--ignore", str(root / path)]
    for node_id in DESELECTED:
        args += ["--deselect", node_id]
    # An explicitly named file would be collected despite --ignore: name only the rest.
    return [*args, *(sel for sel in SELECTED if not _is_ignored(sel, left_out)), *extra]


def _is_ignored(path: str, left_out: list[str]) -> bool:
    return any(path == ignored or path.startswith(ignored + "/") for ignored in left_out)


def _count(junit: Path, files: list[str], left_out: list[str]) -> Counts:
    counts = Counts()
    run_files = [f for f in files if not _is_ignored(f, left_out)]
    counts.files_total = len(run_files)
    broken: set[str] = set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = {child.tag for child in case}
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if not case.get("classname"):
            # A whole file (or package) at collection: pytest names the module in ``name``.
            if "error" in outcome:
                broken.add(case.get("name", "?"))
                counts.errors += 1
                counts.failures.append(f"collection error: {case.get('name')}")
            elif "skipped" in outcome:
                counts.files_skipped += 1
            continue
        counts.collected += 1
        if "skipped" in outcome:
            counts.skipped += 1
        elif "failure" in outcome:
            counts.failed += 1
            counts.failures.append(f"failed: {name}")
        elif "error" in outcome:
            counts.errors += 1
            counts.failures.append(f"error: {name}")
        else:
            counts.passed += 1
    counts.broken_files = sorted(broken)
    broken_paths = {b.replace(".", "/") + ".py" for b in broken} | broken
    counts.files_importing = sum(1 for f in run_files if f not in broken_paths)
    return counts


def run(sdist: Path, extra: list[str], keep: Path | None = None) -> Counts:
    with tempfile.TemporaryDirectory(prefix="lmcache-upstream-unit-") as tmp:
        root = keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        extract_tests(sdist, root)
        junit = root / "junit.xml"
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        # pytest runs under this interpreter, so this one's site-packages is what it sees.
        plugin_installed = importlib.util.find_spec(CUDA_PLUGIN_PACKAGE) is not None
        left_out = _left_out(plugin_installed)
        args = _pytest_args(root, junit, extra, left_out)
        subprocess.run(args, cwd=root, env=env, check=False)
        if not junit.exists():
            raise SystemExit("pytest wrote no report: it did not start (see above)")
        counts = _count(junit, _test_files(root), left_out)
        counts.files_without_plugin = 0 if plugin_installed else len(CUDA_PLUGIN_FILES)
        return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, required=True, help=f"path to {SDIST_NAME}")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 on any failure/error, or when the lmcache-cuda plugin is not installed "
        "(its files would be left out)",
    )
    parser.add_argument("--keep", type=Path, help="extract into this folder and keep it")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    options = parser.parse_args(argv)
    counts = run(options.sdist, options.pytest_args, options.keep)
    # A command-line report: stdout is its output.
    report = [f"  {line}" for line in counts.failures] + [counts.summary()]
    sys.stdout.write("\n".join(report) + "\n")
    if options.strict and (counts.failed or counts.errors or counts.files_without_plugin):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
