"""What to change so a refused cache's blocks become byte ranges on a TPU
generation, each change checked with that generation's compiler: request an
explicit layout through JAX's layout API, split the minor dimension, or pad
the dimension after the blocks. A remedy is only ever one the compiler was
asked about and agreed to (its answer addressable); its cost is the memory
it takes against the cache as it is."""

from __future__ import annotations

from dataclasses import dataclass

from kvref.oracle import OracleUnavailable, lookup, table
from kvref.oracle.compiler import LayoutRefused
from kvref.shape import Layout, Shape
from kvref.shape_key import ShapeKey
from kvref.slices import major_slice

ROW_TILE = (1, 128)  # one row of 128 lanes: each block's rows stay its own
SPLITS = (2, 4, 8, 16, 32)  # parts the minor dimension may be split into
PADS = (2, 4, 8, 16, 32)  # sizes the dimension after the blocks may be padded to


@dataclass(frozen=True)
class Remedy:
    change: str  # what to do, in words a serving engineer acts on
    how: str  # the code or shape that does it
    shape: Shape  # the compiler's layout after the change
    cost: float  # its physical bytes over the original's
    keeps_tiling: bool  # the compiler chose the tiles (no tile was forced)

    @property
    def physical_bytes(self) -> int:
        return self.shape.physical_size_bytes


def remedies(key: ShapeKey, generation: str, original: Shape) -> list[Remedy]:
    """Every candidate the compiler agreed makes blocks addressable, cheapest
    first (fewest bytes, then the compiler's own tiles, then the simplest).
    Empty when the original is addressable already or nothing worked.
    OracleUnavailable when no compiler can be asked."""
    if major_slice(original).addressable:
        return []
    found = []
    for change, how, dims, requested in _candidates(key):
        try:
            answer = lookup(key.dtype, dims, generation, requested=requested)
        except LayoutRefused:
            continue  # the compiler did not agree to this one
        if major_slice(answer.shape).addressable:
            found.append(Remedy(change, how, answer.shape, answer.shape.physical_size_bytes / original.physical_size_bytes,
                                requested is None or not requested.tiles))
    return sorted(found, key=lambda r: (round(r.cost, 6), not r.keeps_tiling))


def cheapest(key: ShapeKey, generation: str, original: Shape) -> Remedy | None:
    """The first of remedies(): shipped in the layout table where it was
    computed at refresh (with the versions it records), else asked live."""
    shipped = table.remedy(generation, str(key))
    if shipped is not None:
        if not shipped:
            return None
        change, how, text, keeps_tiling = shipped
        shape = Shape.parse(text)
        return Remedy(change, how, shape, shape.physical_size_bytes / original.physical_size_bytes, keeps_tiling)
    found = remedies(key, generation, original)
    return found[0] if found else None


def shipped_entry(found: Remedy | None) -> list:
    """How the layout table keeps a shape's cheapest remedy."""
    return [] if found is None else [found.change, found.how, str(found.shape), found.keeps_tiling]


def _candidates(key: ShapeKey):
    """(change, how, dims, requested layout or None) to ask the compiler about."""
    dims, rank = key.dims, len(key.dims)
    row_major = tuple(reversed(range(rank)))  # minor_to_major with dim 0 outermost
    order = tuple(range(rank))
    yield ("request dim 0 outermost", f"out_shardings=Format(Layout(major_to_minor={order}), sharding)",
           dims, Layout(row_major))
    if rank >= 2 and dims[-1] % ROW_TILE[1] == 0:
        yield (f"request dim 0 outermost with tile {ROW_TILE}",
               f"out_shardings=Format(Layout(major_to_minor={order}, tiling=({ROW_TILE},)), sharding)",
               dims, Layout(row_major, (ROW_TILE,)))
    if rank >= 2:
        for parts in SPLITS:
            if dims[-1] % parts == 0 and (dims[-1] // parts) % ROW_TILE[1] == 0:
                split = (*dims[:-1], parts, dims[-1] // parts)
                yield (f"split the last dimension ({dims[-1]}) into {parts} x {dims[-1] // parts}",
                       str(ShapeKey(key.dtype, split)), split, None)
    if rank >= 3:
        for size in PADS:
            if size > dims[1]:
                padded = (dims[0], size, *dims[2:])
                yield (f"pad dimension 1 from {dims[1]} to {size}", str(ShapeKey(key.dtype, padded)), padded, None)


__all__ = ["OracleUnavailable", "Remedy", "cheapest", "remedies"]
