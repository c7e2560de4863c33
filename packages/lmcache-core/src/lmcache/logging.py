"""Logging setup for lmcache processes.

Library modules only call ``logging.getLogger(__name__)``; processes we own (the CLI, the
server) call :func:`init_logger` once to attach a handler to the ``lmcache`` logger.  The
format keeps upstream's ``LMCache <LEVEL>:`` prefix so existing log scrapers still match.
"""

from __future__ import annotations

import logging
import os

LOG_FORMAT = "[%(asctime)s] LMCache %(levelname)s: %(message)s (%(filename)s:%(lineno)d:%(name)s)"
_HANDLER_MARK = "_lmcache_handler"


def resolve_level(level: str | int | None = None) -> int:
    """Level from the argument, else ``LMCACHE_LOG_LEVEL``, else INFO."""
    value = level if level is not None else os.environ.get("LMCACHE_LOG_LEVEL", "INFO")
    if isinstance(value, int):
        return value
    resolved = logging.getLevelName(value.strip().upper())
    if not isinstance(resolved, int):
        raise ValueError(f"unknown log level {value!r} (LMCACHE_LOG_LEVEL / --log-level)")
    return resolved


def init_logger(level: str | int | None = None) -> logging.Logger:
    """Attach one stderr handler to the ``lmcache`` logger (idempotent) and set its level."""
    root = logging.getLogger("lmcache")
    root.setLevel(resolve_level(level))
    if not any(getattr(h, _HANDLER_MARK, False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        setattr(handler, _HANDLER_MARK, True)
        root.addHandler(handler)
    return root


PLUGIN_LOGGER_PREFIX = "lmcache.plugins"


def plugin_logger(module_name: str) -> logging.Logger:
    """The logger of a plugin module, inside the ``lmcache`` tree
    (``lmcache.plugins.<module_name>``): ``--log-level``, ``LMCACHE_LOG_LEVEL`` and the
    handler of :func:`init_logger` apply to it as to the core's own modules."""
    return logging.getLogger(f"{PLUGIN_LOGGER_PREFIX}.{module_name}")
