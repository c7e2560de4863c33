"""Runtime plugins for the MP cache server: every server config, as one JSON object.

This is upstream LMCache 0.5.6's ``lmcache.v1.multiprocess.mp_runtime_plugin_launcher``
API (:class:`MPRuntimePluginLauncher`), implemented for this package.

In MP mode there is no single engine config to hand to plugins, only several config
dataclasses (server, storage, observability, ...).  The launcher serializes each one
under the keyword it was passed with, adds the plugin config's ``extra_config`` as
``runtime_plugin_extra_config``, and starts the plugins through
:class:`~lmcache.v1.multiprocess.runtime_plugins.launcher.RuntimePluginLauncher` with no role
(so no file-name filtering) as worker 0 of 1.  Values JSON cannot hold (paths, enums,
...) become strings.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from lmcache.v1.multiprocess.runtime_plugins.launcher import RuntimePluginLauncher

logger = logging.getLogger(__name__)


class RuntimePluginSettings(Protocol):
    """What is read from upstream's ``RuntimePluginConfig`` (``extra_config`` optional)."""

    @property
    def locations(self) -> list[str]: ...


def _json_safe(value: Any) -> Any:
    """``value`` with containers rebuilt and anything not JSON-native turned into ``str``."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(item) for item in value]
    return str(value)


def _config_dict(name: str, config: object) -> dict[str, Any]:
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(
            f"Expected a dataclass instance for config {name!r}, got {type(config).__name__}"
        )
    return {key: _json_safe(value) for key, value in dataclasses.asdict(config).items()}


@dataclass
class _MPPluginConfig:
    """The config object ``RuntimePluginLauncher`` reads: locations and ``to_json``."""

    runtime_plugin_locations: list[str]
    extra_config: dict[str, Any] = field(default_factory=dict)
    configs_dict: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        blob = dict(self.configs_dict)
        if self.extra_config:
            blob["runtime_plugin_extra_config"] = _json_safe(self.extra_config)
        return json.dumps(blob)


class MPRuntimePluginLauncher:
    """Starts the MP server's runtime plugins with all of its configs in their environment.

    ``configs`` are dataclass instances, passed by the name plugins find them under in
    ``LMCACHE_RUNTIME_PLUGIN_CONFIG``; anything else raises ``TypeError``.
    """

    def __init__(self, runtime_plugin_config: RuntimePluginSettings, **configs: object) -> None:
        aggregated = {name: _config_dict(name, config) for name, config in configs.items()}
        extra = getattr(runtime_plugin_config, "extra_config", None) or {}
        self._plugin_config = _MPPluginConfig(
            runtime_plugin_locations=list(runtime_plugin_config.locations),
            extra_config=dict(extra),
            configs_dict=aggregated,
        )
        self._inner = RuntimePluginLauncher(
            config=self._plugin_config, role=None, worker_count=1, worker_id=0
        )
        logger.info(
            "MP runtime plugins: locations %s, configs %s",
            self._plugin_config.runtime_plugin_locations,
            sorted(aggregated),
        )

    def launch_plugins(self) -> None:
        """Start every configured plugin."""
        self._inner.launch_plugins()

    def stop_plugins(self) -> None:
        """Terminate the plugins still running."""
        self._inner.stop_plugins()
