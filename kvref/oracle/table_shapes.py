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


# Small caches over four chips, split each way a serving stack splits one.
# kvprobe's sharded probes move these whole; shipping their layouts spares a
# first run on a new machine the compiler.
FOUR_CHIP_SPLITS = {
    "heads": "mesh(model=4) spec(None,None,model)",
    "replicated": "mesh(model=2,replica=2) spec(None,None,model)",
    "blocks": "mesh(data=4) spec(data)",
    "blocks_and_heads": "mesh(data=2,model=2) spec(data,None,model)",
}
SMALL_CACHES: tuple[tuple[str, tuple[int, ...]], ...] = tuple(("bf16", (64, 16, heads, 128)) for heads in (2, 4, 8))


def table_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """Whole arrays: the seeds, the KV shapes in every table dtype, the small
    caches, and each serving cache (kvref.serving) on one device."""
    from kvref.serving import serving_caches

    shapes = list(SEED_SHAPES)
    shapes += [(dtype, dims) for dtype in TABLE_DTYPES for dims in kv_dims()]
    shapes += SMALL_CACHES
    shapes += [(c.key.dtype, c.key.dims) for _, c in serving_caches()]
    return list(dict.fromkeys(shapes))


def sharded_table_shapes() -> list[tuple[str, tuple[int, ...], "Sharding"]]:
    """The serving caches (kvref.serving) that are split over a mesh, and the
    small caches under each four-chip split that divides them: the table
    holds one device's shard of each, compiled over its mesh."""
    from kvref.serving import serving_caches
    from kvref.sharding import Sharding

    found = [(c.key.dtype, c.key.dims, c.sharding) for _, c in serving_caches() if c.sharding is not None]
    for dtype, dims in SMALL_CACHES:
        for text in FOUR_CHIP_SPLITS.values():
            sharding = Sharding.parse(text)
            try:
                sharding.check(dims)
            except ValueError:  # this split does not divide this cache
                continue
            found.append((dtype, dims, sharding))
    return found
