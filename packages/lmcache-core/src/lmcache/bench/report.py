"""Render ``lmcache bench ... --json`` files as markdown tables (``lmcache bench report FILE...``).

One table per file, under a heading naming the benchmark, the file and the lmcache
version; columns are the keys of the result rows, numbers with two decimals.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="JSON written by --json")
    parser.add_argument("--output", "-o", metavar="PATH", help="write markdown here, not stdout")


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(rows: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns and not isinstance(row[k], (dict, list))]
    lines = [
        "| " + " | ".join(columns) + " |",
        "|" + "|".join("---:" if _numeric(rows, c) else "---" for c in columns) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def _numeric(rows: list[dict[str, Any]], column: str) -> bool:
    values = [r[column] for r in rows if column in r]
    return bool(values) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
    )


def render(path: str, document: Any) -> str:
    if not isinstance(document, dict) or not isinstance(document.get("results"), list):
        raise ValueError(f"{path}: not an lmcache bench --json file (no 'results' list)")
    name = document.get("benchmark", "?")
    version = document.get("lmcache_version", "?")
    parts = [f"### `lmcache bench {name}` ({path}, lmcache {version})", ""]
    rows = [r for r in document["results"] if isinstance(r, dict)]
    parts.append(table(rows) if rows else "_no results_")
    for key in ("summary", "lookup"):
        if isinstance(document.get(key), dict):
            parts += [
                "",
                f"{key}: " + ", ".join(f"{k} {_cell(v)}" for k, v in document[key].items()),
            ]
    return "\n".join(parts) + "\n"


def run(args: argparse.Namespace) -> int:
    sections = []
    for path in args.files:
        try:
            with open(path) as f:
                document = json.load(f)
            sections.append(render(path, document))
        except (OSError, ValueError) as exc:
            print(f"lmcache bench report: {exc}")
            return 2
    text = "\n".join(sections)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        print(text, end="")
    return 0
