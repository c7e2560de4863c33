"""Start-up check of the upstream 0.5.6 settings this server accepts but does not act on.

Upstream command lines and configs parse here unchanged (:mod:`.flags`, :mod:`.p2p`,
:mod:`.coordinator`), so a setting for a feature this server lacks must not vanish
silently: each one that would turn such a feature on is logged as a warning, once, when
the server starts.  ``--transport grpc`` is refused instead: clients configured for gRPC
could never reach a ZMQ-only server.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from lmcache.compat.upstream_056.server_settings.coordinator import (
    CoordinatorConfig,
    coordinator_settings_in_use,
    parse_args_to_coordinator_config,
)
from lmcache.compat.upstream_056.server_settings.flags import ENGINE_TYPES, TRANSPORTS
from lmcache.compat.upstream_056.server_settings.p2p import P2PConfig, parse_args_to_p2p_config
from lmcache.compat.upstream_056.server_settings.server_module_spec import (
    ExtServerModuleSpec,
    parse_server_module_specs,
)


@dataclass
class UpstreamSettings:
    """Upstream's settings for features this server lacks, as parsed from the flags."""

    transport: str = "zmq"
    grpc_server_workers: int = 32
    null_block_id: int = 0
    engine_type: str = "default"
    isolated_ipc: bool = False
    server_modules: list[ExtServerModuleSpec] = field(default_factory=list)
    p2p_config: P2PConfig = field(default_factory=P2PConfig)
    coordinator: CoordinatorConfig | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, with_coordinator: bool = True) -> UpstreamSettings:
        """``ValueError`` for a bad ``--server-module`` or coordinator value; the
        coordinator settings only with ``with_coordinator`` and its flags parsed."""
        return cls(
            transport=getattr(args, "transport", "zmq"),
            grpc_server_workers=getattr(args, "grpc_server_workers", 32),
            null_block_id=getattr(args, "null_block_id", 0),
            engine_type=getattr(args, "engine_type", "default"),
            isolated_ipc=bool(getattr(args, "isolated_ipc", False)),
            server_modules=parse_server_module_specs(getattr(args, "server_module", [])),
            # a parser without the --p2p-* / coordinator groups gets their defaults
            p2p_config=parse_args_to_p2p_config(args),
            coordinator=(
                parse_args_to_coordinator_config(args) if hasattr(args, "coordinator_url") else None
            ),
        )

    def validate(self) -> None:
        """Upstream's value checks (its wording, which its tests match)."""
        if self.transport not in TRANSPORTS:
            raise ValueError(f"argument --transport: {self.transport!r} is not one of {TRANSPORTS}")
        if self.engine_type not in ENGINE_TYPES:
            raise ValueError(
                f"argument --engine-type: {self.engine_type!r} is not one of {ENGINE_TYPES}"
            )
        if self.grpc_server_workers < 1:
            raise ValueError(
                f"argument --grpc-server-workers: grpc server workers must be >= 1; "
                f"got {self.grpc_server_workers}"
            )


def ignored_settings(settings: UpstreamSettings) -> list[str]:
    """Upstream features ``settings`` ask for that this server lacks."""
    ignored: list[str] = []
    if settings.engine_type != "default":
        ignored.append(f"--engine-type {settings.engine_type} (CacheBlend; prefix caching is used)")
    if settings.null_block_id != 0:
        ignored.append(f"--null-block-id {settings.null_block_id} (null chunks are not skipped)")
    if settings.isolated_ipc:
        ignored.append("--isolated-ipc (container-isolated IPC)")
    for spec in settings.server_modules:
        ignored.append(f"--server-module {spec.module_path}:{spec.factory_name} (not loaded)")
    if settings.p2p_config.enabled:
        ignored.append(f"P2P transfer advertised at {settings.p2p_config.advertise_url}")
    if settings.coordinator is not None:
        ignored += coordinator_settings_in_use(settings.coordinator)
    return ignored


def check_supported(settings: UpstreamSettings) -> list[str]:
    """Refuse ``--transport grpc`` (``ValueError``); return every other ignored setting."""
    settings.validate()
    if settings.transport != "zmq":
        raise ValueError(
            f"--transport {settings.transport} is not available: this server speaks ZMQ only"
        )
    return ignored_settings(settings)
