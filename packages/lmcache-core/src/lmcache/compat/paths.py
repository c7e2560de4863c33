"""The one table of import paths that resolve somewhere else, and the finder that serves it.

Two kinds of rows, both ``old dotted name -> home module``:

* :data:`UPSTREAM_PATHS`: upstream LMCache 0.5.6's module paths whose code lives elsewhere
  here (mostly in :mod:`lmcache.compat.upstream_056`, some in product homes);
* :data:`MOVED_PATHS`: lmcache-core's own former module paths, kept importable for code
  written against an earlier lmcache-core.

A row naming a package covers its whole subtree (``a.b.c`` under a row ``a.b -> x.y`` is
``x.y.c``); the longest matching row wins.  :class:`AliasFinder`, installed at ``import
lmcache``, answers for exactly these names and hands back the home module object itself,
so module identity holds: ``lmcache.v1.pin_monitor is
lmcache.compat.upstream_056.pin_monitor``, and ``monkeypatch.setattr`` on either name
patches the one module.  Nothing is imported until a row is used.

Real stub files remain only for paths the seeds, plugins and our own users import
(``platform._device_detect``, ``memory_management``, ``torch_ops.plan``,
``storage_backend.redis_backend``, ``multiprocess.custom_types``,
``multiprocess.mp_cache_server``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Mapping, Sequence

_C = "lmcache.compat.upstream_056"
_MP = "lmcache.v1.multiprocess"

#: Upstream 0.5.6's module path -> where it lives here.
UPSTREAM_PATHS: Mapping[str, str] = {
    "lmcache.lmcache_native": f"{_C}.lmcache_native",
    "lmcache.observability": f"{_C}.observability",
    "lmcache.v1.distributed": f"{_C}.distributed",
    "lmcache.v1.distributed.l2_adapters": "lmcache.v1.storage_backend.l2_adapters",
    "lmcache.v1.distributed.quota_manager": "lmcache.v1.storage_backend.quota",
    "lmcache.v1.distributed.serde.aesgcm": "lmcache.v1.storage_backend.serde.aesgcm",
    "lmcache.v1.distributed.serde.fp8": "lmcache.v1.storage_backend.serde.fp8",
    "lmcache.v1.distributed.serde.key_provider": "lmcache.v1.storage_backend.serde.key_provider",
    "lmcache.v1.exceptions": f"{_C}.exceptions",
    "lmcache.v1.gpu_connector": f"{_C}.gpu_connector",
    "lmcache.v1.internal_api_server": f"{_C}.internal_api_server",
    "lmcache.v1.internal_api_server.common": f"{_MP}.server.operator_routes",
    "lmcache.v1.internal_api_server.common.periodic_thread_api": (
        f"{_C}.http_apis.periodic_thread_api"
    ),
    "lmcache.v1.memory_allocators": f"{_C}.memory_allocators",
    "lmcache.v1.mp_coordinator": f"{_C}.mp_coordinator",
    "lmcache.v1.periodic_thread": f"{_C}.periodic_thread",
    "lmcache.v1.pin_monitor": f"{_C}.pin_monitor",
    "lmcache.v1.platform.devices": f"{_C}.devices",
    "lmcache.v1.platform.event_notifier": f"{_C}.event_notifier",
    "lmcache.v1.platform.stream": f"{_C}.stream",
    "lmcache.v1.plugin": f"{_C}.plugin",
    "lmcache.v1.plugin.runtime_plugin_launcher": f"{_MP}.runtime_plugins.launcher",
    "lmcache.v1.utils.router_discovery": f"{_C}.router_discovery",
    f"{_MP}.config": f"{_C}.mp_config",
    f"{_MP}.futures": f"{_C}.futures",
    f"{_MP}.group_view": f"{_C}.group_view",
    f"{_MP}.http_api_registry": f"{_C}.http_api_registry",
    f"{_MP}.http_apis": f"{_C}.http_apis",
    f"{_MP}.modules": f"{_C}.modules",
    f"{_MP}.mp_runtime_plugin_launcher": f"{_MP}.runtime_plugins.mp_launcher",
    f"{_MP}.native_completion": f"{_C}.native_completion",
    f"{_MP}.object_group_transfer": f"{_C}.object_group_transfer",
    f"{_MP}.posix_shm": f"{_C}.posix_shm",
    f"{_MP}.session": f"{_C}.session",
    f"{_MP}.token_hasher": f"{_C}.token_hasher",
    f"{_MP}.transfer_mode": "lmcache.v1.platform.transfer_mode",
}

#: lmcache-core's own earlier module paths -> their current homes.
MOVED_PATHS: Mapping[str, str] = {
    "lmcache.v1.memory.host_buffers": f"{_C}.host_buffers",
    "lmcache.v1.native_compat": f"{_C}.native_compat",
    "lmcache.v1.platform.cpu.posix_shm": f"{_C}.posix_shm",
    "lmcache.v1.platform.ipc_policy": f"{_C}.ipc_policy",
    f"{_MP}.client": f"{_MP}.worker.client",
    f"{_MP}.coordinator_config": f"{_C}.server_settings.coordinator",
    f"{_MP}.http_server": f"{_MP}.server.http_frontend",
    f"{_MP}.kv_layout": f"{_MP}.server.kv_layout",
    f"{_MP}.p2p_config": f"{_C}.server_settings.p2p",
    f"{_MP}.runtime_plugin_config": f"{_MP}.runtime_plugins.settings",
    f"{_MP}.server.unsupported": f"{_C}.server_settings.ignored",
    f"{_MP}.server_module_spec": f"{_C}.server_settings.server_module_spec",
}

ALL_PATHS: Mapping[str, str] = {**UPSTREAM_PATHS, **MOVED_PATHS}

#: Product module -> compatibility module whose ``__all__`` is added to it once it loads:
#: upstream names on a path that is ours too (the product file never imports compat).
UPSTREAM_EXTRAS: Mapping[str, str] = {
    "lmcache.v1.memory_management": f"{_C}.memory_management_extras",
}


def home_of(name: str, table: Mapping[str, str] = ALL_PATHS) -> str | None:
    """The module ``name`` resolves to (longest matching row), or ``None`` if no row does."""
    prefix = name
    while True:
        home = table.get(prefix)
        if home is not None:
            return home + name[len(prefix) :]
        if "." not in prefix:
            return None
        prefix = prefix.rpartition(".")[0]


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias by importing its home and returning that very module object."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.home_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.home)
        self.home_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # The home module already ran.  The import system has just set the alias's spec on
        # it; put the home's back, so reload() and introspection see the real module.
        module.__spec__ = self.home_spec


class _ExtrasLoader(importlib.abc.Loader):
    """Runs a product module's own loader, then adds a compatibility module's names."""

    def __init__(self, loader: importlib.abc.Loader, extras: str) -> None:
        self.loader = loader
        self.extras = extras

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        extras = importlib.import_module(self.extras)
        for name in extras.__all__:
            setattr(module, name, getattr(extras, name))


class AliasFinder(importlib.abc.MetaPathFinder):
    """Serves the rows of a path table (see the module docstring)."""

    def __init__(
        self,
        table: Mapping[str, str] = ALL_PATHS,
        extras: Mapping[str, str] = UPSTREAM_EXTRAS,
    ) -> None:
        self.table = table
        self.extras = extras

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in self.extras:
            return self._spec_with_extras(fullname, path, target)
        home = home_of(fullname, self.table)
        if home is None:
            return None
        try:
            home_spec = importlib.util.find_spec(home)
        except ModuleNotFoundError:  # the home's parent package is missing
            return None
        if home_spec is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname,
            _AliasLoader(home),
            is_package=home_spec.submodule_search_locations is not None,
        )

    def _spec_with_extras(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ExtrasLoader(spec.loader, self.extras[fullname])
                return spec
        return None


def install() -> AliasFinder:
    """Put the finder first on ``sys.meta_path`` (once per process) and return it."""
    for finder in sys.meta_path:
        if isinstance(finder, AliasFinder):
            return finder
    finder = AliasFinder()
    sys.meta_path.insert(0, finder)
    return finder
