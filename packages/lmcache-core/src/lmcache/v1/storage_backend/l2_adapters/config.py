"""L2 adapter configuration: one config class per adapter type, registered by type name.

Each ``--l2-adapter`` JSON object names its ``"type"``; the class registered for that
name (:func:`register_l2_adapter_type`) builds a config from the rest with ``from_dict``.
Keys every adapter accepts are read here, not by the adapter: ``affinity_tag``,
``shared``, ``eviction`` (``eviction_policy`` / ``trigger_watermark`` /
``eviction_ratio``), ``persist_enabled`` and ``serde``.  Upstream's path
``lmcache.v1.distributed.l2_adapters.config`` is this module.
"""

from __future__ import annotations

import abc
import argparse
import json
import logging
from dataclasses import dataclass
from typing import Any, TypeVar

from lmcache.v1.storage_backend.l2_adapters.pending import import_all_pending, import_pending_until
from lmcache.v1.storage_backend.serde.base import SerdeConfig
from lmcache.v1.storage_backend.serde.factory import parse_serde_config

logger = logging.getLogger(__name__)

T = TypeVar("T", bound="L2AdapterConfigBase")

EVICTION_POLICIES = ("LRU", "ARC", "IsolatedLRU", "noop")
"""The policies an adapter's ``"eviction"`` may name (upstream's)."""


@dataclass(frozen=True)
class PersistConfig:
    """Whether an adapter keeps its data at shutdown (``persist_enabled``, default true)."""

    persist_enabled: bool = True


@dataclass(frozen=True)
class L2EvictionSpec:
    """An adapter's ``"eviction"`` object: evict ``eviction_ratio`` of the capacity with
    ``eviction_policy`` once usage passes ``trigger_watermark``."""

    eviction_policy: str
    trigger_watermark: float = 0.8
    eviction_ratio: float = 0.2


_L2_ADAPTER_CONFIG_REGISTRY: dict[str, type[L2AdapterConfigBase]] = {}


def register_l2_adapter_type(name: str, config_cls: type[L2AdapterConfigBase]) -> None:
    """Register ``config_cls`` as the config of adapter type ``name`` (once per name)."""
    if name in _L2_ADAPTER_CONFIG_REGISTRY:
        raise ValueError(f"L2 adapter type already registered: {name!r}")
    _L2_ADAPTER_CONFIG_REGISTRY[name] = config_cls


def _ensure_config_loaded(name: str) -> None:
    """Import the built-in module that registers ``name`` if it is not registered yet."""
    import_pending_until(lambda: name in _L2_ADAPTER_CONFIG_REGISTRY)


def get_l2_adapter_config_class(type_name: str) -> type[L2AdapterConfigBase]:
    """The config class registered for ``type_name``; ``ValueError`` if there is none."""
    _ensure_config_loaded(type_name)
    if type_name not in _L2_ADAPTER_CONFIG_REGISTRY:
        raise ValueError(f"unknown L2 adapter type {type_name!r}")
    return _L2_ADAPTER_CONFIG_REGISTRY[type_name]


def get_registered_l2_adapter_types() -> list[str]:
    """Every adapter type name, sorted (built-in ones imported first)."""
    import_all_pending()
    return sorted(_L2_ADAPTER_CONFIG_REGISTRY)


def get_type_name_for_config(config: L2AdapterConfigBase) -> str:
    """The type name ``config``'s exact class is registered under."""
    for name, cls in _L2_ADAPTER_CONFIG_REGISTRY.items():
        if type(config) is cls:
            return name
    raise ValueError(f"Unregistered L2 adapter config type: {type(config).__name__}")


class L2AdapterConfigBase(abc.ABC):
    """Base of the per-type adapter configs (``from_dict`` and ``help``).

    The common keys are set on the instance after ``from_dict`` (see the module doc).
    ``serde_config`` is the parsed ``"serde"`` object (the tier is wrapped with it).
    """

    affinity_tag: str = "_default"
    eviction_config: L2EvictionSpec | None = None
    shared: bool = False
    persist_config: PersistConfig = PersistConfig()
    serde_config: SerdeConfig | None = None

    @staticmethod
    def _parse_serde_config(d: dict[str, Any]) -> SerdeConfig | None:
        """The ``"serde"`` object as a :class:`SerdeConfig`, or None when absent."""
        serde = d.get("serde")
        if serde is None:
            return None
        return parse_serde_config(serde, "L2 adapter")

    @staticmethod
    def _parse_eviction_config(d: dict[str, Any]) -> L2EvictionSpec | None:
        """The ``"eviction"`` object, or None (no adapter eviction) when absent."""
        eviction = d.get("eviction")
        if eviction is None:
            return None
        if not isinstance(eviction, dict):
            raise ValueError(f"'eviction' must be a dict, got {type(eviction).__name__}")
        policy = eviction.get("eviction_policy")
        if policy not in EVICTION_POLICIES:
            raise ValueError(
                f"eviction.eviction_policy must be one of {', '.join(EVICTION_POLICIES)}, "
                f"got {policy!r}"
            )
        return L2EvictionSpec(
            eviction_policy=policy,
            trigger_watermark=float(eviction.get("trigger_watermark", 0.8)),
            eviction_ratio=float(eviction.get("eviction_ratio", 0.2)),
        )

    @staticmethod
    def _parse_persist_config(d: dict[str, Any]) -> PersistConfig:
        return PersistConfig(persist_enabled=bool(d.get("persist_enabled", True)))

    @staticmethod
    def _validate_num_workers(raw: object) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
            raise ValueError("num_workers must be a positive integer")
        return raw

    @staticmethod
    def _validate_per_op_workers(per_op_workers: dict[str, int] | None) -> dict[str, int] | None:
        if per_op_workers is None:
            return None
        for key, value in per_op_workers.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"per_op_workers[{key!r}] must be a positive integer, got {value!r}"
                )
        return per_op_workers

    @staticmethod
    def _parse_per_op_workers_from_dict(d: dict[str, object]) -> dict[str, int] | None:
        raw = d.get("per_op_workers")
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ValueError("per_op_workers must be a dict")
        workers: dict[str, int] = {}
        for key, value in raw.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"per_op_workers[{key!r}] must be an integer, got {type(value).__name__}"
                )
            workers[str(key)] = value
        return workers

    @classmethod
    @abc.abstractmethod
    def from_dict(cls: type[T], d: dict) -> T:
        """The config of one adapter spec (``d`` still holds ``"type"``); ``ValueError``
        for a missing or bad field."""

    @classmethod
    @abc.abstractmethod
    def help(cls) -> str:
        """The JSON fields of this adapter type, for error messages and ``--help``."""


@dataclass
class L2AdaptersConfig:
    """The adapters of one server, in ``--l2-adapter`` order."""

    adapters: list[L2AdapterConfigBase]


_L2_ADAPTER_ARG_DEST = "l2_adapter"


def add_l2_adapters_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add upstream's repeatable ``--l2-adapter JSON`` to ``parser``."""
    group = parser.add_argument_group(
        "L2 Adapters", "L2 adapter instances, one JSON object with a 'type' per --l2-adapter."
    )
    group.add_argument(
        "--l2-adapter",
        dest=_L2_ADAPTER_ARG_DEST,
        action="append",
        default=[],
        type=str,
        metavar="JSON",
        help="Adapter spec as JSON with a 'type'; repeat for several adapters. Types: "
        + ", ".join(sorted(get_registered_l2_adapter_types())),
    )
    return parser


def parse_adapter_spec(spec: dict[str, Any], where: str = "--l2-adapter") -> L2AdapterConfigBase:
    """The config of one adapter spec, common keys included; errors name ``where``."""
    type_name = spec.get("type")
    if not isinstance(type_name, str):
        raise ValueError(f"{where}: missing 'type' field")
    _ensure_config_loaded(type_name)
    config_cls = _L2_ADAPTER_CONFIG_REGISTRY.get(type_name)
    if config_cls is None:
        known = ", ".join(sorted(_L2_ADAPTER_CONFIG_REGISTRY)) or "(none)"
        raise ValueError(f"{where}: unknown adapter type {type_name!r}. Known: {known}")
    try:
        affinity_tag = spec.get("affinity_tag", "_default")
        if not isinstance(affinity_tag, str) or not affinity_tag.strip():
            raise ValueError("affinity_tag must be a non-empty string")
        config = config_cls.from_dict({k: v for k, v in spec.items() if k != "affinity_tag"})
        config.affinity_tag = affinity_tag
        config.shared = bool(spec.get("shared", False))
        config.eviction_config = L2AdapterConfigBase._parse_eviction_config(spec)
        config.persist_config = L2AdapterConfigBase._parse_persist_config(spec)
        config.serde_config = L2AdapterConfigBase._parse_serde_config(spec)
    except (TypeError, ValueError) as exc:
        logger.error("adapter type %r accepts:\n%s", type_name, config_cls.help())
        raise ValueError(f"{where} ({type_name!r}): {exc}") from exc
    return config


def parse_args_to_l2_adapters_config(args: argparse.Namespace) -> L2AdaptersConfig:
    """The adapters of ``args.l2_adapter`` (JSON strings), in order."""
    configs: list[L2AdapterConfigBase] = []
    for i, raw in enumerate(getattr(args, _L2_ADAPTER_ARG_DEST, None) or []):
        where = f"--l2-adapter #{i + 1}"
        try:
            spec = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"Invalid JSON for {where}: {exc}") from exc
        if not isinstance(spec, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(spec).__name__}")
        configs.append(parse_adapter_spec(spec, where))
    return L2AdaptersConfig(adapters=configs)
