"""Upstream 0.5.6's import paths for its built-in device specs (``devices.<name>``).

lmcache-core ships only the CPU backend (:mod:`lmcache.v1.platform.cpu`); vendor backends
are plugin wheels found through the ``lmcache.device_plugins`` entry points.  So
``devices.cpu`` re-exports the in-tree CPU classes, and ``devices.cuda`` / ``devices.rocm``
resolve, on first attribute access, to the classes of the installed plugin that registered
that backend; without it they raise ``ImportError`` naming the wheel to install.  The
registry imports these packages while it scans, so nothing here may touch it at import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["plugin_spec"]


def plugin_spec(backend_name: str, wheel: str, wanted: str) -> Any:
    """The registered spec of ``backend_name``, or ``ImportError`` naming ``wheel``."""
    from lmcache.v1.platform.registry import get_registry

    backend = get_registry().backends.get(backend_name)
    if backend is not None:
        return backend.spec
    raise ImportError(
        f"{wanted} is provided by the {wheel} plugin wheel, and no installed plugin "
        f"registers the {backend_name!r} backend: pip install {wheel} "
        f"(`lmcache devices` lists what is installed)"
    )
