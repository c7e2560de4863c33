"""Upstream LMCache 0.5.6's ``lmcache.v1.multiprocess.config``.

lmcache-core's server configuration (:mod:`lmcache.v1.multiprocess.server_config`) plus
upstream's settings for features this server lacks, with upstream's names:
``MPServerConfig`` gains ``transport``, ``grpc_server_workers``, ``null_block_id``,
``engine_type``, ``isolated_ipc``, ``server_modules`` and ``p2p_config``;
``add_mp_server_args`` adds upstream's flags for them, and the coordinator and P2P
settings (``add_coordinator_args`` + ``parse_args_to_coordinator_config``,
``add_p2p_args`` + ``parse_args_to_p2p_config``) parse as upstream's.  The subclass is
still an :class:`lmcache.v1.multiprocess.server_config.MPServerConfig`, so it runs a
server; ``lmcache server`` itself takes these flags through its extension
(:mod:`.server_settings.extension`) and reports them as ignored.
"""

from __future__ import annotations

import argparse
import dataclasses

from lmcache.compat.upstream_056.server_settings.coordinator import (
    DEFAULT_COORDINATOR_CONFIG,
    DEFAULT_KAFKA_CACHE_EVENT_TOPIC,
    DEFAULT_KAFKA_DELIVERY_TIMEOUT,
    CoordinatorConfig,
    HttpCacheEventSinkConfig,
    KafkaCacheEventSinkConfig,
    add_coordinator_args,
    parse_args_to_coordinator_config,
)
from lmcache.compat.upstream_056.server_settings.flags import (
    ENGINE_TYPES,
    TRANSPORTS,
    add_upstream_server_args,
)
from lmcache.compat.upstream_056.server_settings.ignored import UpstreamSettings
from lmcache.compat.upstream_056.server_settings.p2p import (
    DEFAULT_P2P_CONFIG,
    P2PConfig,
    add_p2p_args,
    parse_args_to_p2p_config,
)
from lmcache.compat.upstream_056.server_settings.server_module_spec import (
    ExtServerModuleSpec,
    parse_server_module_specs,
)
from lmcache.v1.multiprocess import server_config as _product
from lmcache.v1.multiprocess.server_config import (
    AUTO_SHM,
    CACHE_POLICIES,
    DEFAULT_MAX_MESSAGE_BYTES,
    LOG_LEVELS,
    MPTransferMode,
    RuntimePluginConfig,
    add_admin_args,
    add_http_frontend_args,
    add_observability_args,
    add_runtime_plugin_args,
    apply_config_file,
    default_l1_size_gb,
    explicit_flags,
    load_config_file,
    log_level,
    meminfo_available_bytes,
    non_negative_float,
    parse_args_to_runtime_plugin_config,
    positive_float,
    positive_int,
    tcp_port,
    tcp_port_or_off,
    track_explicit_flags,
    usable_directory,
)

__all__ = [
    "AUTO_SHM",
    "CACHE_POLICIES",
    "DEFAULT_COORDINATOR_CONFIG",
    "DEFAULT_KAFKA_CACHE_EVENT_TOPIC",
    "DEFAULT_KAFKA_DELIVERY_TIMEOUT",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_P2P_CONFIG",
    "ENGINE_TYPES",
    "LOG_LEVELS",
    "TRANSPORTS",
    "CoordinatorConfig",
    "ExtServerModuleSpec",
    "HttpCacheEventSinkConfig",
    "KafkaCacheEventSinkConfig",
    "MPServerConfig",
    "MPTransferMode",
    "P2PConfig",
    "RuntimePluginConfig",
    "add_admin_args",
    "add_coordinator_args",
    "add_http_frontend_args",
    "add_mp_server_args",
    "add_observability_args",
    "add_p2p_args",
    "add_runtime_plugin_args",
    "apply_config_file",
    "config_from_args",
    "default_l1_size_gb",
    "explicit_flags",
    "load_config_file",
    "log_level",
    "meminfo_available_bytes",
    "non_negative_float",
    "parse_args_to_coordinator_config",
    "parse_args_to_mp_server_config",
    "parse_args_to_p2p_config",
    "parse_args_to_runtime_plugin_config",
    "parse_server_module_specs",
    "positive_float",
    "positive_int",
    "tcp_port",
    "tcp_port_or_off",
    "track_explicit_flags",
    "usable_directory",
]


# Upstream's server settings that are MPServerConfig fields there (its coordinator settings
# are a CoordinatorConfig of their own).
_UPSTREAM_FIELDS = tuple(
    f.name for f in dataclasses.fields(UpstreamSettings) if f.name != "coordinator"
)


@dataclasses.dataclass
class MPServerConfig(_product.MPServerConfig):
    """lmcache-core's config plus upstream's settings for features this server lacks."""

    transport: str = "zmq"
    grpc_server_workers: int = 32
    null_block_id: int = 0
    engine_type: str = "default"
    isolated_ipc: bool = False
    server_modules: list[ExtServerModuleSpec] = dataclasses.field(default_factory=list)
    p2p_config: P2PConfig = dataclasses.field(default_factory=P2PConfig)

    def validate(self) -> MPServerConfig:
        super().validate()
        self.upstream_settings().validate()
        return self

    def upstream_settings(self) -> UpstreamSettings:
        return UpstreamSettings(**{name: getattr(self, name) for name in _UPSTREAM_FIELDS})


def add_mp_server_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """lmcache-core's server flags plus upstream's for features this server lacks."""
    _product.add_mp_server_args(parser)
    add_upstream_server_args(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> MPServerConfig:
    """The config the flags describe (``ValueError`` for a bad ``--server-module``)."""
    product = _product.config_from_args(args)
    fields = {f.name: getattr(product, f.name) for f in dataclasses.fields(product)}
    upstream = UpstreamSettings.from_args(args, with_coordinator=False)
    return MPServerConfig(**fields, **{name: getattr(upstream, name) for name in _UPSTREAM_FIELDS})


def parse_args_to_mp_server_config(args: argparse.Namespace) -> MPServerConfig:
    """Upstream's name: :func:`config_from_args`, validated (``ValueError`` if bad)."""
    return config_from_args(args).validate()
