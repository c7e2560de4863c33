"""Start-up check of the upstream 0.5.6 settings this server accepts but does not act on.

Upstream command lines and configs parse here unchanged (:mod:`..config`), so a setting
for a feature this server lacks must not vanish silently: each one that would turn such a
feature on is logged as a warning, once, when the server starts.  ``--transport grpc`` is
refused instead: clients configured for gRPC could never reach a ZMQ-only server.
"""

from __future__ import annotations

import logging

from lmcache.v1.multiprocess.config import MPServerConfig
from lmcache.v1.multiprocess.coordinator_config import (
    CoordinatorConfig,
    coordinator_settings_in_use,
)

logger = logging.getLogger(__name__)


def ignored_settings(
    config: MPServerConfig, coordinator: CoordinatorConfig | None = None
) -> list[str]:
    """Upstream features ``config`` (and ``coordinator``) ask for that this server lacks."""
    ignored: list[str] = []
    if config.engine_type != "default":
        ignored.append(f"--engine-type {config.engine_type} (CacheBlend; prefix caching is used)")
    if config.null_block_id != 0:
        ignored.append(f"--null-block-id {config.null_block_id} (null chunks are not skipped)")
    if config.isolated_ipc:
        ignored.append("--isolated-ipc (container-isolated IPC)")
    for spec in config.server_modules:
        ignored.append(f"--server-module {spec.module_path}:{spec.factory_name} (not loaded)")
    if config.p2p_config.enabled:
        ignored.append(f"P2P transfer advertised at {config.p2p_config.advertise_url}")
    if coordinator is not None:
        ignored += coordinator_settings_in_use(coordinator)
    return ignored


def check_supported(config: MPServerConfig, coordinator: CoordinatorConfig | None = None) -> None:
    """Refuse ``--transport grpc``; log every other ignored setting as a warning."""
    if config.transport != "zmq":
        raise ValueError(
            f"--transport {config.transport} is not available: this server speaks ZMQ only"
        )
    for setting in ignored_settings(config, coordinator):
        logger.warning("ignored, this server does not implement it: %s", setting)
