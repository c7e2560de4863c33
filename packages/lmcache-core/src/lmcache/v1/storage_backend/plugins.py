"""Storage plugins: backends named in the configuration or published as entry points.

A name in ``storage_plugins`` resolves, in order, to
  1. ``"package.module:ClassName"`` written directly as the name;
  2. ``extra_config["storage_plugin.<name>.module_path"]`` and ``...class_name`` (upstream);
  3. an entry point called ``<name>`` in the group ``lmcache.storage_plugins``.
The class is constructed with the :class:`StoragePluginInterface` keywords
(``config=, dst_device=, metadata=, local_cpu_backend=, loop=``); per-plugin options are
read by the plugin from ``extra_config["storage_plugin.<name>.<option>"]``.  A plugin that
fails to resolve or construct is logged and skipped: storage keeps working without it.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import MutableMapping
from importlib.metadata import entry_points
from typing import Any

from lmcache.v1.config import LMCacheEngineConfig, LMCacheMetadata
from lmcache.v1.storage_backend.abstract_backend import StorageBackendInterface
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "lmcache.storage_plugins"


def resolve_plugin_class(name: str, config: LMCacheEngineConfig) -> Any:
    """The class a plugin name stands for; raises LookupError/ImportError when unresolvable."""
    if ":" in name:
        module_path, _, class_name = name.partition(":")
        return getattr(importlib.import_module(module_path), class_name)
    module_path = config.get_extra_config_value(f"storage_plugin.{name}.module_path")
    class_name = config.get_extra_config_value(f"storage_plugin.{name}.class_name")
    if module_path and class_name:
        return getattr(importlib.import_module(module_path), class_name)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    raise LookupError(
        f"storage plugin {name!r}: set extra_config 'storage_plugin.{name}.module_path' and "
        f"'.class_name', write it as 'module:Class', or publish an entry point in "
        f"{ENTRY_POINT_GROUP!r}"
    )


def storage_plugin_launcher(
    config: LMCacheEngineConfig,
    metadata: LMCacheMetadata | None,
    loop: asyncio.AbstractEventLoop | None,
    local_cpu_backend: LocalCPUBackend | None,
    dst_device: str,
    storage_backends: MutableMapping[str, StorageBackendInterface],
) -> None:
    """Construct every plugin in ``config.storage_plugins`` into ``storage_backends``."""
    for name in config.storage_plugins or []:
        try:
            cls = resolve_plugin_class(name, config)
            backend = cls(
                config=config,
                dst_device=dst_device,
                metadata=metadata,
                local_cpu_backend=local_cpu_backend,
                loop=loop,
            )
        except Exception:
            logger.exception("storage plugin %r failed to load; skipped", name)
            continue
        if not isinstance(backend, StorageBackendInterface):
            logger.error("storage plugin %r is not a StorageBackendInterface; skipped", name)
            continue
        storage_backends[name] = backend
        logger.info("storage plugin %r loaded (%s)", name, type(backend).__name__)
