"""Upstream LMCache 0.5.6's ``--server-module`` value: which out-of-tree factory to load.

Upstream's MP server imports ``module_path``, calls ``factory_name`` and adds the modules
it returns.  **This server loads no out-of-tree server modules**: the spec is parsed and
checked as upstream does, and ``lmcache server`` logs a warning that it is not loaded.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

__all__ = ["DEFAULT_FACTORY_NAME", "ExtServerModuleSpec", "parse_server_module_specs"]

DEFAULT_FACTORY_NAME = "build_server_modules"


@dataclasses.dataclass(frozen=True)
class ExtServerModuleSpec:
    module_path: str
    factory_name: str = DEFAULT_FACTORY_NAME
    config: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExtServerModuleSpec:
        """Check the field types of one parsed ``--server-module`` object."""
        module_path = data.get("module_path")
        if not isinstance(module_path, str) or not module_path:
            raise ValueError("server module module_path must be a non-empty string")
        factory_name = data.get("factory_name", DEFAULT_FACTORY_NAME)
        if not isinstance(factory_name, str) or not factory_name:
            raise ValueError("server module factory_name must be a non-empty string")
        config = data.get("config", {})
        if not isinstance(config, dict):
            raise ValueError("server module config must be a JSON object")
        return cls(module_path=module_path, factory_name=factory_name, config=config)


def parse_server_module_specs(values: Iterable[str]) -> list[ExtServerModuleSpec]:
    """One spec per ``--server-module`` JSON object; ``ValueError`` names a bad one."""
    specs = []
    for value in values:
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--server-module must be valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"--server-module must be a JSON object, got {value!r}")
        specs.append(ExtServerModuleSpec.from_dict(data))
    return specs
