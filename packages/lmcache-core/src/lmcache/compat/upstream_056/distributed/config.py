"""Upstream's ``lmcache.v1.distributed.config``: the storage manager's flags as a config.

Upstream builds its MP storage manager from a ``StorageManagerConfig``; lmcache-core's
server reads the same flags into :class:`~lmcache.v1.multiprocess.server_config.
MPServerConfig` and the tiers into :class:`~lmcache.v1.storage_backend.tier_settings.
TierSettings`.  Here the flags are the product's own (``server_flags.add_storage_args`` and
``add_storage_manager_args``: one definition), and :func:`parse_args_to_config` gives
upstream's view of what they say: the eviction settings, the L2 policies and adapters, and
L1 as the product's :class:`~lmcache.v1.storage_backend.l1_settings.L1Settings`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from lmcache.v1.multiprocess.config_file import track_explicit_flags
from lmcache.v1.multiprocess.server_config import l1_settings_from_flags
from lmcache.v1.multiprocess.server_flags import add_storage_args
from lmcache.v1.multiprocess.server_flags import add_storage_manager_args as _add_manager_args
from lmcache.v1.storage_backend.l1_settings import L1Settings
from lmcache.v1.storage_backend.l2_adapters.config import (
    L2AdaptersConfig,
    parse_args_to_l2_adapters_config,
)


@dataclass
class EvictionConfig:
    """Which policy evicts, and when (upstream's field names and defaults)."""

    eviction_policy: str
    trigger_watermark: float = field(default=0.8)
    eviction_ratio: float = field(default=0.2)
    extra_logging_enabled: bool = field(default=False)
    extra_logging_interval: float = field(default=10.0)


@dataclass
class StorageManagerConfig:
    """What the storage-manager flags configure (upstream's names where they exist)."""

    l1_size_gb: float | None
    eviction_config: EvictionConfig
    l1_settings: L1Settings
    l2_adapter_config: L2AdaptersConfig = field(default_factory=lambda: L2AdaptersConfig([]))
    store_policy: str = "default"
    prefetch_policy: str = "default"
    prefetch_max_in_flight: int = 8
    periodic_notifier_interval_ms: int = 5


def add_storage_manager_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Upstream's storage-manager flags (and ``--l2-adapter``) on ``parser``."""
    track_explicit_flags(parser)  # the flags' actions (``--flag/--no-flag`` pairs)
    add_storage_args(parser)
    _add_manager_args(parser)
    return parser


def get_arg_parser() -> argparse.ArgumentParser:
    return add_storage_manager_args(argparse.ArgumentParser(description="LMCache storage manager"))


def parse_args_to_config(args: argparse.Namespace) -> StorageManagerConfig:
    """The storage manager's configuration the parsed flags give."""
    eviction = EvictionConfig(
        args.eviction_policy,
        args.eviction_trigger_watermark,
        args.eviction_ratio,
        bool(getattr(args, "enable_extra_logging", False)),
        float(getattr(args, "extra_logging_interval", 10.0)),
    )
    l1 = l1_settings_from_flags(args).validate()
    return StorageManagerConfig(
        l1_size_gb=args.l1_size_gb,
        eviction_config=eviction,
        l1_settings=l1,
        l2_adapter_config=parse_args_to_l2_adapters_config(args),
        store_policy=args.l2_store_policy,
        prefetch_policy=args.l2_prefetch_policy,
        prefetch_max_in_flight=args.l2_prefetch_max_in_flight,
        periodic_notifier_interval_ms=args.periodic_notifier_interval_ms,
    )


def parse_args(args: list[str] | None = None) -> StorageManagerConfig:
    return parse_args_to_config(get_arg_parser().parse_args(args))


__all__ = [
    "EvictionConfig",
    "StorageManagerConfig",
    "add_storage_manager_args",
    "get_arg_parser",
    "parse_args",
    "parse_args_to_config",
]
