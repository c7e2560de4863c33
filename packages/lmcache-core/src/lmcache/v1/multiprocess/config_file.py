"""``lmcache server --config FILE`` and the precedence of the command line over it.

The parser records which flags the command line gave (:func:`explicit_flags`); a config
file's values (YAML or JSON, flag names with dashes or underscores) go through each flag's
own ``type`` and ``choices`` and are set only for flags the command line did not give:
defaults < config file < flags given on the command line.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_EXPLICIT_ATTR = "_explicit_flags"


def _mark_explicit(namespace: argparse.Namespace, dest: str) -> None:
    explicit = getattr(namespace, _EXPLICIT_ATTR, None)
    if explicit is None:
        explicit = set()
        setattr(namespace, _EXPLICIT_ATTR, explicit)
    explicit.add(dest)


class _TrackedStore(argparse._StoreAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        super().__call__(parser, namespace, values, option)
        _mark_explicit(namespace, self.dest)


class _TrackedStoreTrue(argparse._StoreTrueAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        super().__call__(parser, namespace, values, option)
        _mark_explicit(namespace, self.dest)


class _TrackedAppend(argparse._AppendAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        super().__call__(parser, namespace, values, option)
        _mark_explicit(namespace, self.dest)


class _TrackedBooleanOptional(argparse.BooleanOptionalAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        super().__call__(parser, namespace, values, option)
        _mark_explicit(namespace, self.dest)


def track_explicit_flags(parser: argparse.ArgumentParser) -> None:
    """Make every later ``add_argument`` on ``parser`` record that its flag was given."""
    parser.register("action", None, _TrackedStore)
    parser.register("action", "store", _TrackedStore)
    parser.register("action", "store_true", _TrackedStoreTrue)
    parser.register("action", "append", _TrackedAppend)
    # ``--flag/--no-flag`` pairs, spelled ``action="boolean_optional"``.
    parser.register("action", "boolean_optional", _TrackedBooleanOptional)


def explicit_flags(args: argparse.Namespace) -> set[str]:
    """Destinations of the flags given on the command line."""
    return set(getattr(args, _EXPLICIT_ATTR, set()))


def load_config_file(path: str) -> dict[str, Any]:
    """A YAML or JSON mapping of flag names (dashes or underscores) to values."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read --config {path!r}: {exc.strerror or exc}") from None
    try:
        if path.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:
        reason = " ".join(str(exc).split())
        raise ValueError(f"--config {path!r} is not valid YAML/JSON: {reason}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path!r}: expected a mapping of flag names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _flag_name(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return action.option_strings[0]  # the positive spelling, not --no-...
    return action.option_strings[-1] if action.option_strings else action.dest


def _convert_config_value(action: argparse.Action, value: Any, source: str) -> Any:
    """Run one config value through the flag's own ``type`` and ``choices``."""
    where = f"{_flag_name(action)} (from {source})"
    if isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_convert_scalar(action, json.dumps(i) if isinstance(i, dict) else i, where)
                for i in items]  # fmt: skip
    if value is None:
        return None
    if action.nargs in ("*", "+"):
        items = value if isinstance(value, list) else [value]
        return [_convert_scalar(action, i, where) for i in items]
    if isinstance(value, dict) and action.type is not None:
        # A JSON-object flag (e.g. --runtime-plugin-config) written as a mapping.
        return _convert_scalar(action, json.dumps(value), where)
    return _convert_scalar(action, value, where)


def _convert_scalar(action: argparse.Action, value: Any, where: str) -> Any:
    if isinstance(value, (dict, list, bool)):
        raise ValueError(f"{where}: expected a single value, got {value!r}")
    converted: Any = str(value)
    if action.type is not None:
        try:
            converted = action.type(converted)  # type: ignore[operator]
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(str(c) for c in action.choices)
        raise ValueError(f"{where}: invalid choice {value!r} (choose from {choices})")
    return converted


def apply_config_file(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    values: Mapping[str, Any],
    source: str,
    ignore: frozenset[str] = frozenset(),
) -> None:
    """Set ``values`` on ``args`` for every flag the command line did not give."""
    actions = {
        a.dest: a
        for a in parser._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction) and a.dest not in ignore
    }
    unknown = sorted(set(values) - set(actions))
    if unknown:
        raise ValueError(f"unknown keys in {source}: {', '.join(unknown)}")
    given = explicit_flags(args)
    converted = {
        name: _convert_config_value(actions[name], v, source) for name, v in values.items()
    }
    for name, value in converted.items():
        if name not in given:
            setattr(args, name, value)
