"""The device-backend registry and backend selection (one concept per submodule).

The registry is built once per process, on first use, and cached: that cache is the one
piece of process-global state in lmcache (restart processes after installing a plugin).

Discovery, in this order (the order decides which of two equal ``backend_name``s wins):

1. in-tree: every direct sub-package of :mod:`lmcache.v1.platform` (and of
   ``lmcache.v1.platform.devices`` if present), alphabetically; each concrete ``DeviceSpec``
   subclass *defined* in the package's ``__init__`` is instantiated once;
2. entry points of the group ``lmcache.device_plugins``, sorted by
   ``(name, value, distribution name)``.  Set ``LMCACHE_DEVICE_PLUGINS_AUTOLOAD=0`` to skip
   them entirely.

A plugin that fails to import, resolves to anything but a ``DeviceSpec`` subclass, raises
in its constructor, has an invalid or mismatched name, or duplicates an already registered
``backend_name`` is logged with its distribution and the reason, recorded in
``DeviceRegistry.skipped``, and skipped; every other backend stays usable.

Selection (:func:`select_backend`):

* ``LMCACHE_DEVICE_BACKEND=<name>`` picks exactly that backend; it is an error if it is not
  registered, not available, or does not match ``DEVICE_TYPE``.
* otherwise ``DEVICE_TYPE=<type>`` restricts to that device type; among its available
  backends the highest ``priority`` wins, and a tie is an error naming the variable to set.
  If no backend of that type is available, a warning is logged and auto-detection runs.
* otherwise (auto) the first device type, in registry order, with an available backend,
  accelerators before ``cpu``; ``cpu`` is the final fallback.

Submodules: :mod:`.model` (records and variable names), :mod:`.loading` (the rules above and
the recorded skips), :mod:`.discovery` (in-tree and entry-point backends),
:mod:`.selection` (the choice), :mod:`.process` (the per-process cache).  This package
re-exports all of them, and :mod:`lmcache.v1.platform._device_detect` is this package.
"""

from __future__ import annotations

from lmcache.v1.platform.base.baseline import set_torch_baseline
from lmcache.v1.platform.base.device_spec import DeviceSpec
from lmcache.v1.platform.base.event_ipc import set_active_device_resolver, set_device_spec_resolver
from lmcache.v1.platform.base.ipc_wrapper import set_backend_wrapper_importer
from lmcache.v1.platform.registry.discovery import (
    _NON_DEVICE_PACKAGES,  # noqa: F401 - kept importable from the old single module
    _PLATFORM_PACKAGE,  # noqa: F401 - kept importable from the old single module
    _describe_non_class,  # noqa: F401 - kept importable from the old single module
    _entry_point_source,  # noqa: F401 - kept importable from the old single module
    _iter_in_tree_packages,  # noqa: F401 - kept importable from the old single module
    _load_entry_point_specs,  # noqa: F401 - kept importable from the old single module
    _load_in_tree_specs,  # noqa: F401 - kept importable from the old single module
    _plugins_autoload_enabled,  # noqa: F401 - kept importable from the old single module
    _sorted_entry_points,  # noqa: F401 - kept importable from the old single module
    _spec_classes_defined_in,  # noqa: F401 - kept importable from the old single module
    build_registry,
)
from lmcache.v1.platform.registry.loading import (
    _instantiate,  # noqa: F401 - kept importable from the old single module
    _RegistryBuilder,  # noqa: F401 - kept importable from the old single module
    _validate_spec_name,  # noqa: F401 - kept importable from the old single module
)
from lmcache.v1.platform.registry.model import (
    CPU_DEVICE_TYPE,
    DEVICE_BACKEND_ENV_VAR,
    DEVICE_PLUGIN_ENTRY_POINT_GROUP,
    DEVICE_TYPE_ENV_VAR,
    PLUGINS_AUTOLOAD_ENV_VAR,
    BackendSelection,
    BackendSource,
    DeviceRegistry,
    RegisteredBackend,
    SkippedPlugin,
)
from lmcache.v1.platform.registry.process import (
    _cache_lock,  # noqa: F401 - kept importable from the old single module
    _detect_device,  # noqa: F401 - kept importable from the old single module
    _import_torch_baseline,
    clear_caches,
    current_device_spec,
    get_device_spec,
    get_registry,
    get_selection,
    get_torch_device,
    import_backend_ipc_wrappers,
    select_backend,
)
from lmcache.v1.platform.registry.selection import (
    _auto_device_types,  # noqa: F401 - kept importable from the old single module
    _is_available,  # noqa: F401 - kept importable from the old single module
    _pick_by_priority,  # noqa: F401 - kept importable from the old single module
    _select_explicit,  # noqa: F401 - kept importable from the old single module
    _torch_module_for,  # noqa: F401 - kept importable from the old single module
    _usable_candidates,  # noqa: F401 - kept importable from the old single module
    choose_backend,
)

# ``base`` is the leaf every backend builds on, so it never imports the registry or the
# baseline; the registry hands it what it needs when the platform package is imported.
set_torch_baseline(_import_torch_baseline)
set_backend_wrapper_importer(import_backend_ipc_wrappers)
set_active_device_resolver(get_torch_device)
set_device_spec_resolver(get_device_spec)

# The names this module had as one file; ``from ... import *`` exports the public ones.
__all__ = [
    "CPU_DEVICE_TYPE",
    "DEVICE_BACKEND_ENV_VAR",
    "DEVICE_PLUGIN_ENTRY_POINT_GROUP",
    "DEVICE_TYPE_ENV_VAR",
    "PLUGINS_AUTOLOAD_ENV_VAR",
    "BackendSelection",
    "BackendSource",
    "DeviceRegistry",
    "DeviceSpec",
    "RegisteredBackend",
    "SkippedPlugin",
    "build_registry",
    "choose_backend",
    "clear_caches",
    "current_device_spec",
    "get_device_spec",
    "get_registry",
    "get_selection",
    "get_torch_device",
    "import_backend_ipc_wrappers",
    "select_backend",
]
