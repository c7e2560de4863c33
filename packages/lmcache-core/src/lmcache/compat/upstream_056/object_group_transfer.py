"""Upstream LMCache 0.5.6's ``lmcache.v1.multiprocess.object_group_transfer`` (partial).

Upstream keeps its per-object-group GPU copy planning here.  lmcache-core's server moves
KV blocks through :mod:`lmcache.v1.platform` ops instead, so only the device-independent
helper that upstream code and tests import lives here:
:func:`batched_iteration_with_skip`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["batched_iteration_with_skip"]

_T = TypeVar("_T")


def batched_iteration_with_skip(
    lst: Iterable[_T], batch_size: int, skip_count: int
) -> Iterator[tuple[int, tuple[_T, ...]]]:
    """Batches of ``batch_size`` items of ``lst`` after leaving out its first ``skip_count``.

    Yields ``(start, batch)``: ``batch`` is a tuple (the last one may be shorter) and
    ``start`` is the index of its first item in ``lst`` itself, so with ``skip_count=10``
    and ``batch_size=5`` the first batch starts at 10.  Skipping past the end yields
    nothing.

    Raises:
        ValueError: ``batch_size`` below one or a negative ``skip_count`` (raised on the
            first ``next``, as the function is a generator).
    """
    if batch_size < 1:
        raise ValueError(f"batch size must be at least one, got {batch_size}")
    if skip_count < 0:
        raise ValueError(f"skip_count must be non-negative, got {skip_count}")
    items = itertools.islice(lst, skip_count, None)
    start = skip_count
    while True:
        batch = tuple(itertools.islice(items, batch_size))
        if not batch:
            return
        yield start, batch
        start += len(batch)
