"""An independent, naive model of every engine KV layout for the conformance tests.

Written from the layout table in docs/ops.md (facts §1.1), not from the code under test:
each layout is a shape builder plus an accessor returning the views that hold one token row
of (layer, kv, block, offset). The reference transfers loop over tokens with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

Rows = Callable[[Any, Any, int, int, int, int], list[torch.Tensor]]


@dataclass(frozen=True)
class Geometry:
    nl: int
    nb: int
    bs: int
    nh: int
    hs: int


@dataclass(frozen=True)
class RefLayout:
    value: int
    kv_size: int  # planes in the LMCache object
    build: Callable[[Geometry, Callable[..., torch.Tensor]], Any]
    rows: Rows
    nh_of: Callable[[Geometry], int]
    width_of: Callable[[Geometry], int]  # per-head width in the object


def _layers(shape: Callable[[Geometry], tuple[int, ...]]) -> Callable[..., Any]:
    return lambda g, new: [new(shape(g)) for _ in range(g.nl)]


def _heads(g: Geometry) -> int:
    return g.nh


def _one(g: Geometry) -> int:
    return 1


def _hs(g: Geometry) -> int:
    return g.hs


def _two_hs(g: Geometry) -> int:
    return 2 * g.hs


def _two_planes(g: Geometry) -> int:
    return g.hs + g.hs // 2


REF_LAYOUTS: dict[int, RefLayout] = {
    0: RefLayout(0, 2, lambda g, new: new((g.nb, g.nl, 2, g.bs, g.nh, g.hs)),
                 lambda p, g, ly, k, b, o: [p[b, ly, k, o]], _heads, _hs),
    1: RefLayout(1, 2, _layers(lambda g: (2, g.nb, g.bs, g.nh, g.hs)),
                 lambda p, g, ly, k, b, o: [p[ly][k, b, o]], _heads, _hs),
    2: RefLayout(2, 2, _layers(lambda g: (g.nb, 2, g.bs, g.nh, g.hs)),
                 lambda p, g, ly, k, b, o: [p[ly][b, k, o]], _heads, _hs),
    3: RefLayout(3, 1, _layers(lambda g: (g.nb, g.bs, g.hs)),
                 lambda p, g, ly, k, b, o: [p[ly][b, o].unsqueeze(0)], _one, _hs),
    4: RefLayout(4, 2, lambda g, new: [[new((g.nb * g.bs, g.nh, g.hs)) for _ in range(g.nl)]
                                       for _ in range(2)],
                 lambda p, g, ly, k, b, o: [p[k][ly][b * g.bs + o]], _heads, _hs),
    5: RefLayout(5, 1, _layers(lambda g: (g.nb * g.bs, 1, g.hs)),
                 lambda p, g, ly, k, b, o: [p[ly][b * g.bs + o]], _one, _hs),
    6: RefLayout(6, 2, _layers(lambda g: (2, g.nb, g.nh, g.bs, g.hs)),
                 lambda p, g, ly, k, b, o: [p[ly][k, b, :, o]], _heads, _hs),
    7: RefLayout(7, 2, _layers(lambda g: (g.nb, 2, g.nh, g.bs, g.hs)),
                 lambda p, g, ly, k, b, o: [p[ly][b, k, :, o]], _heads, _hs),
    8: RefLayout(8, 2, lambda g, new: new((g.nb, g.nl, 2, g.nh, g.bs, g.hs)),
                 lambda p, g, ly, k, b, o: [p[b, ly, k, :, o]], _heads, _hs),
    9: RefLayout(9, 2, lambda g, new: [[new((g.nb, g.bs, g.nh, g.hs)) for _ in range(g.nl)]
                                       for _ in range(2)],
                 lambda p, g, ly, k, b, o: [p[k][ly][b, o]], _heads, _hs),
    10: RefLayout(10, 1, _layers(lambda g: (g.nb, g.nh, g.bs, 2, g.hs)),
                  lambda p, g, ly, k, b, o: [p[ly][b, :, o].flatten(-2)], _heads, _two_hs),
    11: RefLayout(11, 1, _layers(lambda g: (g.nb, g.bs, g.nh, 2, g.hs)),
                  lambda p, g, ly, k, b, o: [p[ly][b, o].flatten(-2)], _heads, _two_hs),
    12: RefLayout(12, 1, _layers(lambda g: (g.nb, g.nh, g.bs, 2 * g.hs)),
                  lambda p, g, ly, k, b, o: [p[ly][b, :, o]], _heads, _two_hs),
    13: RefLayout(13, 1, _layers(lambda g: (g.nb, g.bs, g.nh, 2 * g.hs)),
                  lambda p, g, ly, k, b, o: [p[ly][b, o]], _heads, _two_hs),
    14: RefLayout(14, 1, _layers(lambda g: (g.nb, g.bs, g.hs)),
                  lambda p, g, ly, k, b, o: [p[ly][b, o].unsqueeze(0)], _one, _hs),
    15: RefLayout(15, 2, _layers(lambda g: (2, g.nb, g.nh, 1, g.bs, g.hs)),
                  lambda p, g, ly, k, b, o: [p[ly][k, b, :, 0, o]], _heads, _hs),
    16: RefLayout(16, 2, lambda g, new: [(new((g.nb, g.bs, g.nh, g.hs)),
                                          new((g.nb, g.bs, g.nh, g.hs))) for _ in range(g.nl)],
                  lambda p, g, ly, k, b, o: [p[ly][k][b, o]], _heads, _hs),
    17: RefLayout(17, 1, lambda g, new: [(new((g.nb, g.bs, 1, g.hs)),
                                          new((g.nb, g.bs, 1, g.hs // 2))) for _ in range(g.nl)],
                  lambda p, g, ly, k, b, o: [p[ly][0][b, o], p[ly][1][b, o]], _one, _two_planes),
    18: RefLayout(18, 1, _layers(lambda g: (g.nb, g.bs, g.nh, g.hs)),
                  lambda p, g, ly, k, b, o: [p[ly][b, o]], _heads, _hs),
}  # fmt: skip


def random_tensor(dtype: torch.dtype, generator: torch.Generator) -> Callable[..., torch.Tensor]:
    def new(shape: tuple[int, ...]) -> torch.Tensor:
        if dtype == torch.uint8:
            return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
        return torch.randn(shape, generator=generator).to(dtype)

    return new


def build_cache(layout: RefLayout, g: Geometry, new: Callable[..., torch.Tensor]) -> Any:
    return layout.build(g, new)


def zeros_like_cache(cache: Any) -> Any:
    if isinstance(cache, torch.Tensor):
        return torch.zeros_like(cache)
    return type(cache)(zeros_like_cache(x) for x in cache)


def flat_tensors(cache: Any) -> list[torch.Tensor]:
    """Every tensor of a container in pointer order (layer-major; K list before V list)."""
    if isinstance(cache, torch.Tensor):
        return [cache]
    return [t for item in cache for t in flat_tensors(item)]


def caches_equal(a: Any, b: Any) -> bool:
    return all(torch.equal(x, y) for x, y in zip(flat_tensors(a), flat_tensors(b)))


def token_row(
    layout: RefLayout, g: Geometry, cache: Any, layer: int, kv: int, block: int, offset: int
) -> torch.Tensor:
    views = layout.rows(cache, g, layer, kv, block, offset)
    return torch.cat([v.reshape(-1) for v in views])


def set_token_row(
    layout: RefLayout, g: Geometry, cache: Any, where: tuple[int, int, int, int], row: torch.Tensor
) -> None:
    start = 0
    for view in layout.rows(cache, g, *where):
        view.copy_(row[start : start + view.numel()].view(view.shape))
        start += view.numel()


def object_shape(layout: RefLayout, g: Geometry, tokens: int) -> tuple[int, ...]:
    row = layout.nh_of(g) * layout.width_of(g)
    return (g.nl, tokens, row) if layout.kv_size == 1 else (2, g.nl, tokens, row)


def object_row(
    layout: RefLayout, obj: torch.Tensor, layer: int, kv: int, token: int
) -> torch.Tensor:
    return obj[layer, token] if layout.kv_size == 1 else obj[kv, layer, token]


def block_walk(
    layout: RefLayout, g: Geometry, block_ids: list[int], blocks_per_object: int, skip: int
) -> Iterator[tuple[int, int, tuple[int, int, int, int]]]:
    """(object index, token in object, (layer, kv, block, offset)) for every moved row."""
    for position, block in enumerate(block_ids):
        if position < skip or block < 0:
            continue
        for offset in range(g.bs):
            token = (position % blocks_per_object) * g.bs + offset
            for layer in range(g.nl):
                for kv in range(layout.kv_size):
                    yield position // blocks_per_object, token, (layer, kv, block, offset)


def reference_block_transfer(
    layout: RefLayout,
    g: Geometry,
    cache: Any,
    objects: list[torch.Tensor],
    block_ids: list[int],
    blocks_per_object: int,
    skip: int,
    store: bool,
) -> None:
    """D2H (``store``) or H2D by hand: one token row at a time."""
    for index, token, where in block_walk(layout, g, block_ids, blocks_per_object, skip):
        row = object_row(layout, objects[index], where[0], where[1], token)
        if store:
            row.copy_(token_row(layout, g, cache, *where))
        else:
            set_token_row(layout, g, cache, where, row)
