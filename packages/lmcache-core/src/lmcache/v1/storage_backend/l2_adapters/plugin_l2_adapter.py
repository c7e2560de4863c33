"""The ``plugin`` adapter type: a third party's adapter class, named by module path.

JSON: ``{"type": "plugin", "module_path": "my_pkg.l2", "class_name": "MyAdapter",
"adapter_params": {...}, "config_class_name": "MyAdapterConfig"}``.  The class must
subclass :class:`~lmcache.v1.storage_backend.l2_adapters.base.L2AdapterInterface`.  It is
constructed with one argument: a config built by ``from_dict(adapter_params)`` when the
module has a config class (``config_class_name``, else ``<class_name>Config``, else the
adapter class's own ``config_class_name`` attribute; it must subclass
``L2AdapterConfigBase``), otherwise the ``adapter_params`` dict itself.  Upstream's
semantics, names and search order.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from lmcache.v1.storage_backend.l2_adapters.base import L2AdapterInterface
from lmcache.v1.storage_backend.l2_adapters.config import (
    L2AdapterConfigBase,
    register_l2_adapter_type,
)
from lmcache.v1.storage_backend.l2_adapters.factory import register_l2_adapter_factory
from lmcache.v1.storage_backend.l2_adapters.types import L1MemoryDesc


def _non_empty_string(d: dict, name: str) -> str:
    value = d.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string")
    return value


class PluginL2AdapterConfig(L2AdapterConfigBase):
    """Where the adapter class is and what to construct it with (see the module doc)."""

    def __init__(
        self,
        module_path: str,
        class_name: str,
        adapter_params: dict[str, Any] | None = None,
        config_class_name: str | None = None,
    ) -> None:
        self.module_path = module_path
        self.class_name = class_name
        self.adapter_params = adapter_params or {}
        self.config_class_name = config_class_name

    @classmethod
    def from_dict(cls, d: dict) -> PluginL2AdapterConfig:
        module_path = _non_empty_string(d, "module_path")
        class_name = _non_empty_string(d, "class_name")
        adapter_params = d.get("adapter_params", {})
        if not isinstance(adapter_params, dict):
            raise ValueError("adapter_params must be a dict")
        config_class_name = d.get("config_class_name")
        if config_class_name is not None and not isinstance(config_class_name, str):
            raise ValueError("config_class_name must be a string")
        return cls(module_path, class_name, adapter_params, config_class_name)

    @classmethod
    def help(cls) -> str:
        return (
            "Plugin L2 adapter config fields:\n"
            "- module_path (str): dotted import path of the module holding the adapter "
            "class (required)\n"
            "- class_name (str): the L2AdapterInterface subclass in that module (required)\n"
            "- adapter_params (dict): passed to the adapter (optional, default {})\n"
            "- config_class_name (str): an L2AdapterConfigBase subclass in that module that "
            "builds the adapter's config from adapter_params (optional; default "
            "<class_name>Config if present)\n"
            'Example: {"type": "plugin", "module_path": "my_plugin.l2", '
            '"class_name": "MyL2Adapter", "adapter_params": {"host": "localhost"}}'
        )


def _resolve_config_class(
    module: ModuleType, config: PluginL2AdapterConfig, adapter_cls: type
) -> type[L2AdapterConfigBase] | None:
    """The first config class found: explicit name, ``<class>Config``, the class's own
    ``config_class_name`` attribute; None means the raw ``adapter_params`` dict."""
    candidates = (
        config.config_class_name,
        config.class_name + "Config",
        getattr(adapter_cls, "config_class_name", None),
    )
    for name in candidates:
        if not name:
            continue
        found = getattr(module, name, None)
        if isinstance(found, type) and issubclass(found, L2AdapterConfigBase):
            return found
    return None


def _create_plugin_adapter(
    config: L2AdapterConfigBase, l1_memory_desc: L1MemoryDesc | None = None
) -> L2AdapterInterface:
    if not isinstance(config, PluginL2AdapterConfig):
        raise TypeError(f"plugin adapter needs a PluginL2AdapterConfig, got {type(config)}")
    try:
        module = importlib.import_module(config.module_path)
    except ImportError as exc:
        raise ImportError(f"Could not import module '{config.module_path}': {exc}") from exc
    try:
        adapter_cls = getattr(module, config.class_name)
    except AttributeError as exc:
        raise AttributeError(
            f"Module '{config.module_path}' has no class '{config.class_name}': {exc}"
        ) from exc
    if not (isinstance(adapter_cls, type) and issubclass(adapter_cls, L2AdapterInterface)):
        raise TypeError(
            f"{config.module_path}.{config.class_name} is not a subclass of L2AdapterInterface"
        )
    kwargs: dict[str, Any] = {}
    if l1_memory_desc is not None:
        kwargs["l1_memory_desc"] = l1_memory_desc
    config_cls = _resolve_config_class(module, config, adapter_cls)
    argument: Any = (
        config_cls.from_dict(config.adapter_params) if config_cls else config.adapter_params
    )
    # The plugin's constructor is its own (a config or a dict), not the base class's.
    adapter: L2AdapterInterface = adapter_cls(argument, **kwargs)  # type: ignore[call-arg]
    return adapter


register_l2_adapter_type("plugin", PluginL2AdapterConfig)
register_l2_adapter_factory("plugin", _create_plugin_adapter)
