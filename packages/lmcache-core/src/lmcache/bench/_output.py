"""What every ``lmcache bench`` module shares: the JSON document, charts and progress bars.

JSON (``--json PATH``)::

    {"benchmark": "server", "lmcache_version": "0.1.0", "created": "<UTC ISO time>",
     "config": {...flags...}, "results": [{...one flat row...}, ...], ...extra keys}

``lmcache bench report`` renders the ``results`` rows of such files as markdown tables.
Charts (``--plot PNG``) need matplotlib (``pip install 'lmcache-core[plot]'``), imported
only when a chart is asked for.  Progress bars (tqdm) go to stderr and only when stderr is
a terminal.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

PLOT_HINT = "--plot needs matplotlib: pip install 'lmcache-core[plot]'"


def output_file(text: str) -> str:
    """A file we will be able to write at the end of a run: checked before the run starts."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file")
    folder = path.absolute().parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} of {text!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text!r} is not writable")
    return text


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", metavar="PATH", type=output_file, help="also write results as JSON"
    )
    parser.add_argument(
        "--plot",
        metavar="PNG",
        type=output_file,
        help="also chart GB/s and ratios (needs matplotlib)",
    )


def config_of(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if not k.startswith("_") and not callable(v)}


def write_json(
    path: str,
    benchmark: str,
    args: argparse.Namespace,
    results: Sequence[dict[str, Any]],
    **extra: Any,
) -> None:
    from lmcache import __version__

    document = {
        "benchmark": benchmark,
        "lmcache_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": config_of(args),
        "results": list(results),
        **extra,
    }
    # Written aside and renamed: a run killed mid-write keeps the previous complete file.
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(document, f, indent=2, default=str)
    os.replace(tmp, path)


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on the Agg backend; exits with an install hint if missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(PLOT_HINT) from None
    return plt


def plot_bars(
    path: str,
    title: str,
    labels: Sequence[str],
    gbps: dict[str, Sequence[float]],
    ratios: dict[str, Sequence[float]],
    ratio_label: str,
) -> None:
    """Two panels: grouped GB/s bars per label, and grouped ratio bars (1.0 marked)."""
    plt = require_matplotlib()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, 0.9 * len(labels) + 3), 7))
    for ax, series, ylabel in ((top, gbps, "GB/s"), (bottom, ratios, ratio_label)):
        width = 0.8 / max(1, len(series))
        for i, (name, values) in enumerate(series.items()):
            xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
            ax.bar(xs, list(values), width, label=name)
        ax.set_xticks(list(range(len(labels))), list(labels), fontsize=7, rotation=20)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    bottom.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
    top.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    print(f"chart written to {path}")


class Bar(Protocol):
    """What benchmarks may call on :func:`progress`'s result (a tqdm bar or a no-op)."""

    def update(self, n: int = 1) -> object: ...

    def set_description_str(self, desc: str) -> object: ...

    def close(self) -> object: ...


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_description_str(self, desc: str) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int, desc: str) -> Bar:
    """A tqdm bar on stderr when it is a terminal (and tqdm is installed), else a no-op."""
    if not sys.stderr.isatty():
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)
