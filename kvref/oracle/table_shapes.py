"""The KV-cache shapes the shipped layout table answers for every generation."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvref.sharding import Sharding

TABLE_DTYPES = ("bf16", "f32", "s8", "f8e4m3fn", "f8e5m2", "s4")

# The layouts verified on the compiler, listed in tests/facts.py.
SEED_SHAPES: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("bf16", (512, 3, 2048)),
    ("bf16", (512, 6144)),
    ("s8", (512, 12288)),
    ("bf16", (512, 4, 2048)),
    ("bf16", (512, 8, 2048)),
    ("bf16", (512, 16, 2048)),
    ("bf16", (1024, 32, 576)),
    ("bf16", (2048, 64, 2, 128)),
    ("f32", (512, 1, 128)),
    ("f32", (7,)),
    ("f32", (1024,)),
)


def kv_dims() -> list[tuple[int, ...]]:
    """Ranks 2-5: rows of hidden size; [blocks, tokens or heads, hidden];
    vLLM's [blocks, block_size, kv_heads, head_dim]; MLA's [blocks, block_size,
    576]; and [blocks, 2 (K and V), block_size, kv_heads, head_dim]."""
    dims = []
    dims += itertools.product((512, 1024), (128, 576, 1024, 2048, 6144, 12288))
    dims += itertools.product((512,), (1, 2, 3, 4, 8, 16, 32), (64, 128, 256, 576, 2048))
    dims += itertools.product((1024,), (16, 32, 64), (1, 2, 8), (64, 128, 256))
    dims += itertools.product((1024,), (16, 32, 64), (576,))
    dims += itertools.product((512,), (2,), (16, 32), (1, 8), (128, 256))
    return [tuple(d) for d in dict.fromkeys(dims)]


def table_shapes() -> list[tuple[str, tuple[int, ...]]]:
    shapes = list(SEED_SHAPES)
    shapes += [(dtype, dims) for dtype in TABLE_DTYPES for dims in kv_dims()]
    return list(dict.fromkeys(shapes))


def sharded_table_shapes() -> list[tuple[str, tuple[int, ...], "Sharding"]]:
    """The serving caches (kvref.serving) that are split over a mesh: the
    table holds one device's shard of each, compiled over its mesh."""
    from kvref.serving import serving_caches

    return [(c.key.dtype, c.key.dims, c.sharding) for _, c in serving_caches() if c.sharding is not None]
