"""The key table of :class:`~lmcache.v1.config.LMCacheEngineConfig` (declarative).

:data:`KEYS` says how each typed key parses and what it must satisfy;
:data:`IMPLEMENTED_KEYS` names the keys something in this core reads (and what reads them);
:data:`NO_EFFECT_HINTS` says where a key without effect here is set instead;
:data:`UPSTREAM_UNUSED_KEYS` are upstream keys accepted only so upstream files load.
"""

from __future__ import annotations

from lmcache.v1.config.parsing import (
    KeySpec,
    non_negative,
    one_of,
    optional,
    parse_bool,
    parse_dict,
    parse_float,
    parse_int,
    parse_size_gb,
    parse_str,
    parse_str_list,
    port,
    positive,
    ratio,
)

CACHE_POLICIES = ("LRU", "FIFO", "LFU", "MRU", "ARC", "IsolatedLRU", "noop")
"""Eviction policy names as spelled in docs and ``--eviction-policy`` (upstream's four:
LRU, ARC, IsolatedLRU, noop; plus our FIFO, LFU, MRU); any case is accepted."""
REMOTE_SERDES = ("naive", "cachegen", "kivi")
_POLICY_BY_FOLDED = {name.casefold(): name for name in CACHE_POLICIES}


def canonical_cache_policy(name: str) -> str:
    """The canonical spelling of an eviction policy name given in any case.

    Raises:
        ValueError: ``name`` names no policy (the message lists them).
    """
    try:
        return _POLICY_BY_FOLDED[str(name).casefold()]
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {name!r}; choose one of {', '.join(CACHE_POLICIES)}"
        ) from None


def _known_cache_policy(value: object) -> str | None:
    if value is None:
        return None
    try:
        canonical_cache_policy(str(value))
    except ValueError as exc:
        return str(exc)
    return None


KEYS: dict[str, KeySpec] = {
    "chunk_size": KeySpec(parse_int, positive),
    "local_cpu": KeySpec(parse_bool),
    "max_local_cpu_size": KeySpec(parse_size_gb, non_negative),
    "local_cpu_use_hugepages": KeySpec(parse_bool),
    "reserve_local_cpu_size": KeySpec(parse_size_gb, non_negative),
    "local_disk": KeySpec(optional(parse_str)),
    "local_disk_path_sharding": KeySpec(parse_str, one_of(("by_gpu", "none"))),
    "max_local_disk_size": KeySpec(parse_size_gb, non_negative),
    "remote_url": KeySpec(optional(parse_str)),
    "remote_serde": KeySpec(parse_str, one_of(REMOTE_SERDES)),
    "save_unfull_chunk": KeySpec(parse_bool),
    "blocking_timeout_secs": KeySpec(parse_int, positive),
    "cache_policy": KeySpec(parse_str, _known_cache_policy),
    "storage_plugins": KeySpec(optional(parse_str_list)),
    "remote_storage_plugins": KeySpec(optional(parse_str_list)),
    "extra_config": KeySpec(optional(parse_dict)),
    "use_layerwise": KeySpec(parse_bool),
    "save_decode_cache": KeySpec(parse_bool),
    "pre_caching_hash_algorithm": KeySpec(parse_str),
    "retrieve_locations": KeySpec(optional(parse_str_list)),
    "store_location": KeySpec(optional(parse_str)),
    "gds_path": KeySpec(optional(parse_str)),
    "gds_path_sharding": KeySpec(parse_str, one_of(("by_gpu", "none"))),
    "gds_buffer_size": KeySpec(optional(parse_int), positive),
    "use_gds": KeySpec(parse_bool),
    "gds_backend": KeySpec(parse_str),
    "maru_path": KeySpec(optional(parse_str)),
    "maru_pool_size": KeySpec(parse_size_gb, non_negative),
    "numa_mode": KeySpec(optional(parse_str)),
    "enable_async_loading": KeySpec(parse_bool),
    "enable_lazy_memory_allocator": KeySpec(parse_bool),
    "lazy_memory_initial_ratio": KeySpec(parse_float, ratio),
    "lazy_memory_expand_trigger_ratio": KeySpec(parse_float, ratio),
    "lazy_memory_step_ratio": KeySpec(parse_float, ratio),
    "lazy_memory_safe_size": KeySpec(parse_size_gb, non_negative),
    "priority_limit": KeySpec(optional(parse_int), non_negative),
    "min_retrieve_tokens": KeySpec(parse_int, non_negative),
    "lookup_timeout_ms": KeySpec(parse_int, non_negative),
    "pin_timeout_sec": KeySpec(parse_int, positive),
    "pin_check_interval_sec": KeySpec(parse_int, positive),
    "mp_host": KeySpec(optional(parse_str)),
    "mp_port": KeySpec(parse_int, port),
    "enable_hidden_state_cache": KeySpec(parse_bool),
    "max_hidden_state_cpu_size": KeySpec(parse_size_gb, non_negative),
}

# The keys something in this core reads, and what reads them.  Every other key of KEYS is
# accepted (upstream files load) but has no effect here: setting one warns, or fails in
# strict mode.  tests/v1/test_config.py checks each entry is really read.
IMPLEMENTED_KEYS: dict[str, str] = {
    "local_cpu": "L1 keeps stored objects (false: L1 only allocates for the lower tiers)",
    "max_local_cpu_size": "size of the L1 host-memory pool",
    "local_disk": "folder(s) of the disk tier",
    "local_disk_path_sharding": "one sub-folder per worker (by_gpu) or none",
    "max_local_disk_size": "size of the disk tier (0: off)",
    "remote_url": "redis:// or rediss:// URL of the Redis tier",
    "blocking_timeout_secs": "how long an L1 allocation waits for eviction to free space",
    "cache_policy": (
        "eviction policy of L1 and the disk tier (LRU, FIFO, LFU, MRU, ARC, IsolatedLRU, "
        "noop; any case)"
    ),
    "storage_plugins": "storage plugin tiers to load",
    "extra_config": "options of tiers and plugins (local_cpu.*, local_disk.*, storage_plugin.*)",
    "pin_timeout_sec": "PinMonitor.GetOrCreate(config): seconds an object may stay pinned",
    "pin_check_interval_sec": "PinMonitor.GetOrCreate(config): seconds between its checks",
    "mp_host": "SGLang's LMCache connector (--lmcache-config-file): the server's host",
    "mp_port": "SGLang's LMCache connector (--lmcache-config-file): the server's port",
}

# Where a key that has no effect through this config is set instead.
NO_EFFECT_HINTS: dict[str, str] = {
    "chunk_size": "the cache server's chunk size is `lmcache server --chunk-size`",
    "save_decode_cache": "vLLM reads lmcache.mp.save_decode_cache",
    "save_unfull_chunk": "the cache server always stores a request's last partial chunk",
}

# Upstream 0.5.6 keys outside storage: accepted so upstream files load, never interpreted.
UPSTREAM_UNUSED_KEYS = frozenset(
    [
        "enable_blending",
        "blend_recompute_ratios",
        "blend_thresholds",
        "blend_check_layers",
        "blend_min_tokens",
        "blend_special_str",
        "enable_p2p",
        "p2p_host",
        "p2p_init_ports",
        "p2p_lookup_ports",
        "enable_controller",
        "lmcache_instance_id",
        "controller_pull_url",
        "controller_reply_url",
        "lmcache_worker_ports",
        "lmcache_worker_ids",
        "lmcache_worker_heartbeat_delay_time",
        "lmcache_worker_heartbeat_time",
        "enable_pd",
        "pd_role",
        "pd_buffer_size",
        "pd_buffer_device",
        "pd_peer_host",
        "pd_peer_init_port",
        "pd_peer_alloc_port",
        "pd_peer_query_port",
        "pd_proxy_host",
        "pd_proxy_port",
        "pd_allocation_timeout_sec",
        "pd_shutdown_timeout_sec",
        "pd_condition_poll_interval_sec",
        "pd_max_prefill_len",
        "pd_backend_mode",
        "pd_skip_proxy_notification",
        "pd_bidirectional",
        "transfer_channel",
        "nixl_backends",
        "nixl_buffer_size",
        "nixl_buffer_device",
        "audit_actual_remote_url",
        "internal_api_server_host",
        "internal_api_server_enabled",
        "internal_api_server_port_start",
        "internal_api_server_include_index_list",
        "internal_api_server_socket_path_prefix",
        "external_lookup_client",
        "py_enable_gc",
        "runtime_plugin_locations",
        "hit_miss_ratio",
        "lookup_server_worker_ids",
        "enable_scheduler_bypass_lookup",
        "script_allowed_imports",
        "run_script_api_enabled",
        "enable_chunk_statistics",
        "chunk_statistics_strategy",
        "enable_kv_events",
        "use_gpu_connector_v3",
        "remote_config_url",
        "app_id",
        "hidden_state_layers",
        "hidden_states_retrieve_mode",
    ]
)
