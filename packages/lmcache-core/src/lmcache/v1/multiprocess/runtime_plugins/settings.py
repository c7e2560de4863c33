"""Upstream LMCache 0.5.6's runtime plugin settings: ``RuntimePluginConfig`` and its flags.

``--runtime-plugin-locations`` names plugin scripts (``.py`` / ``.sh``) or folders of them;
``lmcache server`` starts each as a child process once it serves, with every server config
as JSON in ``LMCACHE_RUNTIME_PLUGIN_CONFIG`` and ``--runtime-plugin-config`` (a JSON
object) under its ``runtime_plugin_extra_config`` key
(:class:`~lmcache.v1.multiprocess.runtime_plugins.mp_launcher.MPRuntimePluginLauncher`),
and stops them when it stops.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

__all__ = [
    "RuntimePluginConfig",
    "add_runtime_plugin_args",
    "json_object",
    "parse_args_to_runtime_plugin_config",
]


@dataclasses.dataclass
class RuntimePluginConfig:
    """Plugin scripts or folders to run beside the server, and the extra config they get."""

    locations: list[str] = dataclasses.field(default_factory=list)
    extra_config: dict[str, Any] = dataclasses.field(default_factory=dict)


def json_object(text: str) -> dict[str, Any]:
    """A flag value that must be a JSON object (``argparse`` type)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_runtime_plugin_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Runtime plugins",
        "Scripts started beside the server (upstream 0.5.6's runtime plugins).",
    )
    group.add_argument(
        "--runtime-plugin-locations",
        nargs="*",
        default=[],
        metavar="PATH",
        help="Plugin scripts (.py, .sh) or folders of them, started once the server serves "
        "and stopped with it; each gets the server's configs as JSON in "
        "LMCACHE_RUNTIME_PLUGIN_CONFIG.",
    )
    group.add_argument(
        "--runtime-plugin-config",
        type=json_object,
        default={},
        metavar="JSON",
        help="A JSON object handed to the plugins as runtime_plugin_extra_config.",
    )


def parse_args_to_runtime_plugin_config(args: argparse.Namespace) -> RuntimePluginConfig:
    """The plugin settings the flags describe (defaults for a parser without them)."""
    return RuntimePluginConfig(
        locations=list(getattr(args, "runtime_plugin_locations", None) or []),
        extra_config=dict(getattr(args, "runtime_plugin_config", None) or {}),
    )
